"""The relay: reads every rank's stdout, stderr, messages and exit status.

One loop thread per process (``loop()``) serves every run; ``Relay.attach`` hands it a rank's fds.
Never blocking on a rank, it appends raw output to the rank's log file (each pipe's in whole lines,
so that the two never split a line) and reports to the ``RelaySink`` on the loop thread (sinks
must return quickly), ``on_closed`` last, once every fd is at EOF: the output is complete. A
drained fd rests ``REST`` seconds, so chatty ranks cost one wakeup per tick.
"""

from __future__ import annotations

import asyncio
import codecs
import collections
import contextlib
import fcntl
import functools
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from nbddp.forkserver.keeper import STATUS
from nbddp.launcher.fds import NOTEBOOK_FDS
from nbddp.launcher.logs import open_rank_log, rank_log
from nbddp.wire.descriptors import Descriptors
from nbddp.wire.protocol import (
    FD_SPACE,
    Body,
    FrameReader,
    encode_with_fds,
    received_fds,
    send_part,
)
from nbddp.wire.stdio import Demux

READ_SIZE = 1 << 16
CTRL_READ_SIZE = 1 << 20
REST = 0.03  # seconds a drained fd waits before it is read again
PIPE_SIZE = 1 << 20  # bytes a rank can write while its pipe rests (Linux default max)


class EventLoopThread:
    """An asyncio loop running forever in one daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        run = self.loop.run_forever
        self.thread = threading.Thread(target=run, name="nbddp-relay", daemon=True)
        self.thread.start()

    def call(self, fn: Callable[..., object], *args: object) -> None:
        """Run ``fn(*args)`` on the loop thread (from any thread)."""
        self.loop.call_soon_threadsafe(fn, *args)


_LOOP: EventLoopThread | None = None
_LOOP_LOCK = threading.Lock()


def _forget_loop() -> None:
    global _LOOP, _LOOP_LOCK  # a forked child has neither the loop's thread nor whoever held this
    _LOOP, _LOOP_LOCK = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_loop)


def loop() -> EventLoopThread:
    """The process-wide relay loop, started on first use."""
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None:
            _LOOP = EventLoopThread()
        return _LOOP


class RelaySink(Protocol):
    """Receives a run's events on the loop thread."""

    def on_output(self, rank: int, stream: str, text: str) -> None:
        """Decoded text a rank wrote to ``stream`` ("stdout" or "stderr")."""

    def on_message(self, rank: int, kind: str, body: Body) -> None:
        """A message the rank's worker sent (see ``protocol``)."""

    def on_link_closed(self, rank: int, unsent: list[str]) -> None:
        """The rank's link reached EOF: normally because its process ended. ``unsent``:
        the messages to it that it closed before they were sent whole, in words."""

    def on_exit(self, rank: int, code: int | None) -> None:
        """The rank's process exited with ``code`` (None: status lost)."""

    def on_closed(self, rank: int) -> None:
        """Every fd of the rank is closed: its output is complete."""


@dataclass
class RankPipes:
    """The notebook's ends of one rank's fds."""

    out: int
    err: int
    ctrl: socket.socket
    status: int

    def fds(self) -> list[int]:
        return [self.out, self.err, self.ctrl.fileno(), self.status]


# What one read of an fd found: nothing yet, less than a buffer, a full buffer, EOF.
EMPTY, SHORT, FULL, CLOSED = range(4)


class Unsent(Exception):
    """A message for a rank that cannot reach it: its link has closed."""


@dataclass
class _Outgoing:
    """A message on its way to a rank: what is left of it, with descriptors (copies)."""

    what: str  # what it is, as a message's words
    data: memoryview
    fds: list[int]


@dataclass
class _RankStreams:
    """The relay's reading state for one rank: its fds, decoders, log and pending frames."""

    pipes: RankPipes
    log: int
    open_fds: set[int] = field(default_factory=set)
    decoders: dict[tuple[int, str], codecs.IncrementalDecoder] = field(default_factory=dict)
    demux: Demux = field(default_factory=Demux)  # the stdout pipe carries Python's stderr too
    frames: FrameReader = field(default_factory=FrameReader)
    exit_reported: bool = False
    ctrl_fd: int = -1  # kept: a closed socket's fileno() is -1
    log_tail: list[str] = field(default_factory=list)
    unlogged: dict[int, bytes] = field(default_factory=dict)  # fd -> its unfinished line
    readers: dict[int, Callable[[], int]] = field(default_factory=dict)  # fd -> one read
    watched: set[int] = field(default_factory=set)  # fds the loop watches for reading
    resting: set[int] = field(default_factory=set)  # fds read at the next tick
    idle: set[int] = field(default_factory=set)  # resting fds the last tick found empty
    outbox: collections.deque[_Outgoing] = field(default_factory=collections.deque)


class _Ended:
    """The sink of a closed relay: a finished run hears nothing more."""

    def on_output(self, rank: int, stream: str, text: str) -> None: ...
    def on_message(self, rank: int, kind: str, body: Body) -> None: ...
    def on_link_closed(self, rank: int, unsent: list[str]) -> None: ...
    def on_exit(self, rank: int, code: int | None) -> None: ...
    def on_closed(self, rank: int) -> None: ...


class Relay:
    def __init__(self, log_dir: Path, sink: RelaySink, *, ctrl_rests: bool = True) -> None:
        self.log_dir = log_dir
        self.sink = sink
        self.loop = loop()
        self._ranks: dict[int, _RankStreams] = {}
        self._tick: asyncio.TimerHandle | None = None  # armed while any fd rests
        self.ctrl_rests = ctrl_rests  # False: control messages are read as they come

    def log_path(self, rank: int) -> Path:
        return rank_log(self.log_dir, rank)

    def attach(self, rank: int, pipes: RankPipes) -> None:
        """Start relaying ``rank`` (any thread). The relay now owns ``pipes``."""
        NOTEBOOK_FDS.keep(*pipes.fds())
        self.loop.call(self._attach, rank, pipes)

    def close(self) -> None:
        """The run has ended (loop thread): forget its sink and every rank's state."""
        if self._tick is not None:
            self._tick.cancel()
            self._tick = None
        for streams in self._ranks.values():
            streams.readers.clear()  # the partials refer back to this relay
        self._ranks.clear()
        self.sink = _Ended()

    def force_close(self, rank: int) -> None:
        """Stop reading ``rank`` now (loop thread): used when orphans hold its pipes."""
        streams = self._ranks.get(rank)
        if streams is not None:
            for fd in list(streams.open_fds):
                self._close_fd(rank, streams, fd)

    def log_at_end(self, rank: int, text: str) -> None:
        """Append ``text`` to ``rank``'s log once its output is complete (loop thread)."""
        streams = self._ranks.get(rank)
        if streams is not None:
            streams.log_tail.append(text)

    def send(self, rank: int, kind: str, body: object) -> None:
        """Send ``(kind, body)``, any size, with any ``Descriptors``' fds (loop thread); what the
        socket does not take at once is written as the worker reads. ``Unsent`` when ``rank``'s
        link is closed; one that closes before the message is out names it to ``on_link_closed``."""
        # Why a queue on the loop: the loop must never wait on a rank, and frames stay
        # whole and in order because this one thread writes them. Why not large bodies
        # in shared memory: the small frame left could still meet a full socket.
        assert threading.current_thread() is self.loop.thread, "send on the relay loop"
        streams = self._ranks.get(rank)
        if streams is None or streams.ctrl_fd not in streams.open_fds:
            raise Unsent(f"rank {rank}'s {kind!r} message was not sent: its link is closed")
        data, fds = encode_with_fds(kind, body)
        what = f"its {kind!r} message ({len(data):,} bytes)"
        streams.outbox.append(_Outgoing(what, memoryview(data), [os.dup(fd) for fd in fds]))
        if len(streams.outbox) == 1:
            self._write(rank, streams)

    def drain(self, rank: int) -> None:
        """Read ``rank``'s stdout and stderr now until empty, resting or not (loop thread)."""
        streams = self._ranks.get(rank)
        if streams is not None:
            _read_all(streams, streams.pipes.out, streams.pipes.err)

    def log_now(self, rank: int, text: str) -> None:
        """Append ``text`` to ``rank``'s log at once (loop thread)."""
        streams = self._ranks.get(rank)
        if streams is not None and streams.open_fds:  # the log closes with the last fd
            os.write(streams.log, text.encode("utf-8", "backslashreplace"))

    def _attach(self, rank: int, pipes: RankPipes) -> None:
        log = open_rank_log(self.log_dir, rank)
        streams = _RankStreams(pipes, log, set(pipes.fds()), ctrl_fd=pipes.ctrl.fileno())
        self._ranks[rank] = streams
        utf8 = codecs.getincrementaldecoder("utf-8")
        for stream, fd in (("stdout", pipes.out), ("stderr", pipes.err)):
            streams.decoders[fd, stream] = utf8(errors="replace")
            if stream == "stdout":  # it carries Python's stderr too (``wire.stdio``)
                streams.decoders[fd, "stderr"] = utf8(errors="replace")
            os.set_blocking(fd, False)
            with contextlib.suppress(OSError, AttributeError):  # F_SETPIPE_SZ: Linux only
                fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
            streams.readers[fd] = functools.partial(self._read_stream, rank, streams, stream, fd)
            self._watch(streams, fd)
        pipes.ctrl.setblocking(False)
        streams.readers[streams.ctrl_fd] = functools.partial(self._read_ctrl, rank, streams)
        self._watch(streams, streams.ctrl_fd)
        os.set_blocking(pipes.status, False)
        self.loop.loop.add_reader(pipes.status, self._on_status, rank)

    def _write(self, rank: int, streams: _RankStreams) -> None:
        """Write ``rank``'s queued messages until they are out, or its socket is full: then
        again once it has room."""
        outbox = streams.outbox
        try:
            while outbox:
                out = outbox[0]
                sent, carried = send_part(streams.pipes.ctrl, out.data, out.fds)
                Descriptors(out.fds[:carried], owned=True).close()
                out.data, out.fds = out.data[sent:], out.fds[carried:]
                if not out.data:
                    outbox.popleft()
        except BlockingIOError:
            self.loop.loop.add_writer(streams.ctrl_fd, self._write, rank, streams)
            return
        except OSError:
            pass  # the worker closed its end: reading it reaches EOF, which names the rest
        self.loop.loop.remove_writer(streams.ctrl_fd)

    def _read_stream(self, rank: int, streams: _RankStreams, stream: str, fd: int) -> int:
        try:
            data = os.read(fd, READ_SIZE)
        except BlockingIOError:
            return EMPTY
        except OSError:
            data = b""
        split = stream == "stdout"
        if not data:
            self._pass_on(rank, streams, fd, streams.demux.end() if split else [])
            for (of, piece_stream), decoder in streams.decoders.items():
                if of == fd and (tail := decoder.decode(b"", final=True)):
                    self.sink.on_output(rank, piece_stream, tail)
            self._close_fd(rank, streams, fd)
            return CLOSED
        self._pass_on(rank, streams, fd, streams.demux.feed(data) if split else [(stream, data)])
        return SHORT if len(data) < READ_SIZE else FULL

    def _pass_on(
        self, rank: int, streams: _RankStreams, fd: int, pieces: list[tuple[str, bytes]]
    ) -> None:
        """Log each piece read from ``fd`` and hand its text to the sink."""
        # Logged up to a line end: a line cut by a read is never split by the other pipe's.
        held = streams.unlogged.pop(fd, b"") + b"".join(data for _, data in pieces)
        cut = len(held) if len(held) > READ_SIZE else max(map(held.rfind, (b"\n", b"\r"))) + 1
        os.write(streams.log, held[:cut])
        streams.unlogged[fd] = held[cut:]
        for stream, data in pieces:
            text = streams.decoders[fd, stream].decode(data)
            if text:
                self.sink.on_output(rank, stream, text)

    def _read_ctrl(self, rank: int, streams: _RankStreams) -> int:
        fds: list[int] = []
        try:
            data, ancdata, _, _ = streams.pipes.ctrl.recvmsg(
                CTRL_READ_SIZE, FD_SPACE, socket.MSG_CMSG_CLOEXEC
            )
            fds = received_fds(ancdata)
        except BlockingIOError:
            return EMPTY
        except OSError:
            data = b""
        if not data:
            streams.frames.feed(b"", fds)  # owned by the reader, closed with it
            self._close_fd(rank, streams, streams.ctrl_fd)
            return CLOSED
        for kind, body in streams.frames.feed(data, fds):
            self.sink.on_message(rank, kind, body)
        # Mid-message: the rest is coming; resting would hold it up REST per read.
        return SHORT if len(data) < CTRL_READ_SIZE and not streams.frames.pending else FULL

    def _on_readable(self, streams: _RankStreams, fd: int) -> None:
        # Once drained, an fd rests (a control socket only where ``ctrl_rests``).
        if streams.readers[fd]() == SHORT and (self.ctrl_rests or fd != streams.ctrl_fd):
            self._rest(streams, fd)
        # FULL: stays watched, read again at once; EMPTY: spurious; CLOSED: gone.

    def _on_status(self, rank: int) -> None:
        streams = self._ranks[rank]
        fd = streams.pipes.status
        try:
            data = os.read(fd, STATUS.size)
        except BlockingIOError:
            return
        code = int(STATUS.unpack(data)[0]) if len(data) == STATUS.size else None
        streams.exit_reported = True
        # Read what the rank sent before exiting before reporting the exit, so its
        # own error is never mistaken for a death without one; the rest, unrested.
        _read_all(streams, streams.ctrl_fd, *streams.pipes.fds()[:2])
        for resting_fd in list(streams.resting):
            self._watch(streams, resting_fd)
        self.sink.on_exit(rank, code)
        self._close_fd(rank, streams, fd)

    def _watch(self, streams: _RankStreams, fd: int) -> None:
        streams.resting.discard(fd)
        streams.idle.discard(fd)
        if fd not in streams.watched:
            streams.watched.add(fd)
            self.loop.loop.add_reader(fd, self._on_readable, streams, fd)

    def _rest(self, streams: _RankStreams, fd: int) -> None:
        """Leave ``fd`` unwatched until the next tick: its writes wait in the pipe."""
        if streams.exit_reported:
            # The rank has exited: what is left (an orphan's output, EOF) is read at once.
            self._watch(streams, fd)
            return
        if fd in streams.watched:
            streams.watched.discard(fd)
            self.loop.loop.remove_reader(fd)
        streams.resting.add(fd)
        if self._tick is None:
            self._tick = self.loop.loop.call_later(REST, self._on_tick)

    def _on_tick(self) -> None:
        # An fd is watched again only after two empty ticks in a row: a rank
        # writing every other tick would otherwise wake the loop between ticks.
        self._tick = None
        for streams in list(self._ranks.values()):
            for fd in list(streams.resting):
                if fd not in streams.resting:
                    continue  # closed by what an earlier read reported
                outcome = streams.readers[fd]()
                if outcome == SHORT:
                    streams.idle.discard(fd)
                    self._rest(streams, fd)
                elif outcome == EMPTY and fd not in streams.idle:
                    self._rest(streams, fd)
                    streams.idle.add(fd)
                elif outcome != CLOSED:
                    self._watch(streams, fd)

    def _close_fd(self, rank: int, streams: _RankStreams, fd: int) -> None:
        if fd not in streams.open_fds:
            return
        streams.open_fds.discard(fd)
        os.write(streams.log, streams.unlogged.pop(fd, b""))
        # No longer read at the next tick: the fd number may be reused by then.
        streams.resting.discard(fd)
        streams.idle.discard(fd)
        streams.watched.discard(fd)
        self.loop.loop.remove_reader(fd)
        NOTEBOOK_FDS.release(fd)
        if fd == streams.ctrl_fd:
            self.loop.loop.remove_writer(fd)
            unsent = [out.what for out in streams.outbox]
            for out in streams.outbox:
                Descriptors(out.fds, owned=True).close()
            streams.outbox.clear()
            streams.pipes.ctrl.close()
            streams.frames.close()
            self.sink.on_link_closed(rank, unsent)
        else:
            os.close(fd)
        if fd == streams.pipes.status and not streams.exit_reported:
            # Forced close before the exit code arrived: report it as lost.
            streams.exit_reported = True
            self.sink.on_exit(rank, None)
        if not streams.open_fds:
            os.write(streams.log, "".join(streams.log_tail).encode("utf-8", "backslashreplace"))
            os.close(streams.log)
            self.sink.on_closed(rank)


def _read_all(streams: _RankStreams, *fds: int) -> None:
    """Read each of ``fds`` now until it is empty or closed, resting or not."""
    for fd in fds:
        while fd in streams.open_fds and fd in streams.readers and streams.readers[fd]() == FULL:
            pass
