"""The rank's channel to the notebook, and the one slot per process that holds it.

A ``Channel`` sends protocol messages on the rank's socketpair from any thread (``send`` at once,
``send_row`` batched). The worker ``install``s it before the function runs; ``installed()``
gives it to code in the rank (None outside one). Children the rank forks send only rows, each as
one datagram to the rank (``_Family``, opened before the first fork), which sends them before its
own next message: rows a child logged before the rank's result arrive before it.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import socket
import threading
import time

from nbddp.wire import protocol

Row = protocol.MetricRow

BATCH_INTERVAL = 0.02  # seconds ``send_row`` may hold a message while rows keep coming
TAIL_INTERVAL = 0.1  # seconds the last held messages may wait once rows stop coming
FLUSHER_IDLE = 10  # wakeups with nothing held before the flusher thread ends


class Channel:
    """The rank's side of its link to the notebook; safe to use from any thread.

    ``send`` sends at once, after whatever rows are held. ``send_row`` batches: held rows go
    as one ``metrics`` message with a new row once ``BATCH_INTERVAL`` has passed since the last
    send, and a flusher thread sends the rest within ``TAIL_INTERVAL`` once rows stop. Only a
    process that dies without returning (a signal, ``os._exit``) loses rows: the last
    ``TAIL_INTERVAL`` seconds' worth.
    """

    # Why batch: logging every step would cost a pickle and a syscall per step here and a
    # message there; the flusher wakes rarely because each wakeup takes the training's GIL.

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._pid = os.getpid()  # the rank's: in a forked child, getpid() differs
        self._family: _Family | None = None  # rows from forked children, once the rank forks
        self._lock = threading.Lock()  # held while sending: one message at a time, in order
        # Appended to without the lock (``list.append`` is atomic): ``send_row``
        # runs every training step, where each bytecode counts (the step has
        # just evicted this code from the caches). Senders take rows from the
        # front, never replace the list, so no append is lost.
        self._rows: list[Row] = []
        self._next_send = 0.0  # time.monotonic() from which the next row is sent at once
        self._flusher: threading.Thread | None = None

    def send(self, kind: str, body: object) -> None:
        """Send one message, with the descriptors of any ``descriptors.Descriptors`` in it;
        silently dropped if the notebook has gone (we are dying then)."""
        data, fds = protocol.encode_with_fds(kind, body)
        with self._lock:
            if self._family is not None and os.getpid() == self._pid:
                self._rows.extend(self._family.take())  # children's rows come first
            self._send_locked(data, fds)

    def send_row(self, row: Row) -> None:
        """Send one metric row soon, batched with others (see class docstring)."""
        self._rows.append(row)
        if time.monotonic() >= self._next_send or self._flusher is None:
            with self._lock:
                self._send_locked(b"")
                self._ensure_flusher_locked()

    def _ensure_flusher_locked(self) -> None:
        if self._flusher is None and os.getpid() == self._pid:  # a child holds nothing
            self._flusher = threading.Thread(
                target=self._flush_loop, name="nbddp-metrics", daemon=True
            )
            self._flusher.start()

    def _send_locked(self, data: bytes, fds: list[int] | None = None) -> None:
        rows = self._rows
        count = len(rows)
        if os.getpid() != self._pid:
            self._send_from_child(rows[:count])
            del rows[:count]
            return
        if count:
            data = protocol.encode("metrics", rows[:count]) + data
            del rows[:count]  # rows appended meanwhile stay, for the next send
        self._next_send = time.monotonic() + BATCH_INTERVAL
        with contextlib.suppress(OSError):  # the notebook has gone: we are dying
            if fds:
                protocol.send_with_fds(self.sock, data, fds)
            else:
                self.sock.sendall(data)

    def _flush_loop(self) -> None:
        idle = 0
        while True:
            time.sleep(TAIL_INTERVAL)
            with self._lock:
                if self._rows:
                    idle = 0
                    if time.monotonic() >= self._next_send:
                        self._send_locked(b"")  # rows stopped coming: send the last ones
                    continue
                idle += 1
                if idle < FLUSHER_IDLE and self.sock.fileno() >= 0:
                    continue
                # Unregistered before the last look at the rows: a row appended
                # after that look is sure to see no flusher and start one.
                me, self._flusher = self._flusher, None
                if not self._rows:
                    return
                self._flusher = me

    def _send_from_child(self, rows: list[Row]) -> None:
        """In a forked child: ``rows`` to the rank, which sends them on (module contract)."""
        if not rows:
            return
        if self._family is None:  # forked without Python's fork hooks (from C)
            raise RuntimeError(
                "nbddp.log: this process was forked from a rank without os.fork, so its "
                "rows cannot reach the notebook; log from the rank instead"
            )
        self._family.post(rows)

    def before_fork(self) -> None:
        """In the rank, before it forks: open the socket its children send rows on."""
        if self._family is None and os.getpid() == self._pid:
            self._family = _Family()
            threading.Thread(target=self._adopt_loop, name="nbddp-children", daemon=True).start()

    def after_fork_in_child(self) -> None:
        """In a forked child: hold nothing of the rank's, send each row at once."""
        self._lock = threading.Lock()  # the rank's may have been held by another thread
        self._rows = []  # the rank's held rows are the rank's to send
        self._flusher = None  # the rank's flusher thread does not exist here
        self._next_send = 0.0

    def _adopt_loop(self) -> None:
        family = self._family
        assert family is not None
        while True:
            select.select([family.rx], [], [])
            with self._lock:
                self._rows.extend(family.take())
                self._ensure_flusher_locked()  # sends them within TAIL_INTERVAL


class _Family:
    """A rank's datagram socketpair for rows from its forked children: made by the rank and
    inherited only by the processes it forks, so only they can send on it."""

    def __init__(self) -> None:
        self.rx, self.tx = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.rx.setblocking(False)

    def take(self) -> list[Row]:
        """Every row that has arrived, without waiting."""
        rows: list[Row] = []
        while True:
            try:
                data = self.rx.recv(MAX_DATAGRAM)
            except BlockingIOError:
                return rows
            try:
                rows.extend(pickle.loads(data))
            except Exception:
                continue  # not a row list: only our children write here, so never expected

    def post(self, rows: list[Row]) -> None:
        """From a child: send ``rows`` as one datagram; blocks while the rank's queue is full."""
        with contextlib.suppress(OSError):  # the rank has gone: the child is stopped with it
            self.tx.send(pickle.dumps(rows, protocol=pickle.HIGHEST_PROTOCOL))


MAX_DATAGRAM = 1 << 18  # bytes: more than a datagram socket's send buffer lets through

_installed: Channel | None = None


def install(channel: Channel | None) -> None:
    """Make ``channel`` this process's rank channel (the worker, once); None removes it."""
    global _installed
    _installed = channel


def installed() -> Channel | None:
    """This rank's channel; None outside a launched rank."""
    return _installed


def _before_fork() -> None:
    if _installed is not None:
        _installed.before_fork()


def _after_fork_in_child() -> None:
    if _installed is not None:
        _installed.after_fork_in_child()


os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
