"""The worker: the entry point of one rank's process.

Contract: ``serve(ctrl)`` waits for one ``RunOrder`` on ``ctrl``, sets up the
rank (environment, ``sys.path``, working directory, torch threads, CUDA
device, optionally the process group), calls the function and sends back
exactly one of ``result`` / ``error`` / ``exit``, then returns the process
exit code. The worker is one-shot: it serves one order and exits.

Before ``serve`` the starter has already made the process the leader of its
own session (so stopping it can signal the whole group, DataLoader workers
included) and pointed fd 1 and fd 2 at pipes the notebook reads, so C/C++
output and faulthandler dumps reach the notebook like ``print`` does, and
every byte written before a crash is already out of this process.

The worker watches its link to the notebook: if the notebook goes away
(kernel restart, kernel killed), the link reaches EOF and the worker kills
its own process group at once.
"""

from __future__ import annotations

import faulthandler
import io
import os
import pickle
import signal
import socket
import sys
import threading
import time
import traceback
from datetime import timedelta
from typing import Any

from nbddp.wire import protocol, tocpu
from nbddp.wire.payload import load_call
from nbddp.wire.protocol import ErrorInfo, RunOrder

BATCH_INTERVAL = 0.02  # seconds ``send_soon`` may hold a message while rows keep coming
TAIL_INTERVAL = 0.1  # seconds the last held messages may wait once rows stop coming
FLUSHER_IDLE = 10  # wakeups with nothing held before the flusher thread ends


class Channel:
    """The rank's side of its link to the notebook; safe to use from any thread.

    ``send`` sends at once. ``send_row`` (metric rows) batches: rows are
    held and sent together as one ``metrics`` message (a list of rows) by
    the calling thread, with the new row, if nothing was sent in the last
    ``BATCH_INTERVAL`` seconds; a flusher thread sends what is left within
    ``TAIL_INTERVAL`` once rows stop coming (it is started by a row that
    finds none, and ends after ``FLUSHER_IDLE`` wakeups with nothing held,
    or at once with nothing held once ``sock`` is closed).
    Order is kept: ``send`` first sends whatever is held. Why batch: a loop
    that logs every step would otherwise pay a pickle and a system call per
    step, and the notebook a message per step; and why the flusher wakes
    only every ``TAIL_INTERVAL``: each wakeup takes the GIL from the
    training thread. What is held is lost only if the process dies without
    returning (a signal, ``os._exit``): the last rows, at most
    ``TAIL_INTERVAL`` seconds of them.
    """

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._lock = threading.Lock()  # held while sending: one message at a time, in order
        # Appended to without the lock (``list.append`` is atomic): ``send_row``
        # runs every training step, where each bytecode counts (the step has
        # just evicted this code from the caches). Senders take rows from the
        # front, never replace the list, so no append is lost.
        self._rows: list[dict[str, Any]] = []
        self._next_send = 0.0  # time.monotonic() from which the next row is sent at once
        self._flusher: threading.Thread | None = None

    def send(self, kind: str, body: Any) -> None:
        """Send one message; silently dropped if the notebook has gone (we are dying then)."""
        data = protocol.encode(kind, body)
        with self._lock:
            self._send_locked(data)

    def send_row(self, row: dict[str, Any]) -> None:
        """Send one metric row soon, batched with others (see class docstring)."""
        self._rows.append(row)
        if time.monotonic() >= self._next_send or self._flusher is None:
            with self._lock:
                self._send_locked(b"")
                if self._flusher is None:
                    self._flusher = threading.Thread(
                        target=self._flush_loop, name="nbddp-metrics", daemon=True
                    )
                    self._flusher.start()

    def _send_locked(self, data: bytes) -> None:
        rows = self._rows
        count = len(rows)
        if count:
            data = protocol.encode("metrics", rows[:count]) + data
            del rows[:count]  # rows appended meanwhile stay, for the next send
        self._next_send = time.monotonic() + BATCH_INTERVAL
        try:
            self.sock.sendall(data)
        except OSError:
            pass

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


CHANNEL: Channel | None = None
"""The running rank's channel; None outside a worker (``nbddp.log`` is then a no-op)."""


def redirect_stdio(out_fd: int, err_fd: int) -> None:
    """Point fd 1/2 at the relay pipes and rebuild ``sys.stdout``/``sys.stderr`` over them.

    Used by starters that fork (a spawned worker gets its fds from Popen).
    Line buffering matches a terminal: a line leaves the process when it
    ends (one ``write`` system call per line), and ``flush()`` (which tqdm
    calls) sends partial lines. Why ``write_through``: text goes straight
    to the binary buffer, which the newline flushes; the same system calls,
    but a ``print`` costs a training step about 4 us less than when the text
    layer keeps its own pending buffer too (measured in a training loop).
    """
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    for fd in {out_fd, err_fd} - {1, 2}:
        os.close(fd)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 - lives as long as the process
    sys.stdout = _text_stream(1)
    sys.stderr = _text_stream(2)


def _text_stream(fd: int) -> io.TextIOWrapper:
    raw = io.FileIO(fd, "w", closefd=False)
    return io.TextIOWrapper(
        io.BufferedWriter(raw),
        encoding="utf-8",
        errors="backslashreplace",
        line_buffering=True,
        write_through=True,
    )


def reset_signals() -> None:
    """Give the rank default signal behaviour, whatever its parent had installed."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.set_wakeup_fd(-1)


def set_process_name(name: str) -> None:
    """Name this process (``ps``, ``top``, psutil ``name()``) so that users and tests
    can tell ranks apart; DataLoader workers inherit the name. Linux only; best effort."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(15, name.encode()[:15], 0, 0, 0)  # 15 = PR_SET_NAME
    except (OSError, AttributeError):
        pass


def _watch_link(sock: socket.socket) -> None:
    """Block on the link; when the notebook is gone, take the whole group down."""
    while True:
        try:
            msg = protocol.recv(sock)
        except OSError:
            msg = None
        if msg is None:
            break
    # Why SIGKILL to the group: the notebook that would collect our output and
    # stop our children no longer exists; nothing of this rank may outlive it.
    if os.getpgrp() == os.getpid():
        os.killpg(os.getpid(), signal.SIGKILL)
    os._exit(1)


def _apply_order(order: RunOrder) -> None:
    os.environ.clear()
    os.environ.update(order.env)
    sys.path[:] = order.sys_path
    try:
        os.chdir(order.cwd)
    except OSError as exc:
        print(f"nbddp: could not enter {order.cwd}: {exc}", file=sys.stderr)


def _prepare_torch(order: RunOrder) -> None:
    torch = sys.modules.get("torch")
    threads = order.env.get("OMP_NUM_THREADS", "")
    if torch is not None and threads.isdigit():
        # torch was imported before this rank's environment was set (forkserver,
        # fork), so apply the thread count it would have read at import.
        torch.set_num_threads(int(threads))
    if order.set_cuda_device or order.init_process_group:
        import torch as torch_mod

        if order.set_cuda_device:
            torch_mod.cuda.set_device(int(order.env["LOCAL_RANK"]))
        if order.init_process_group:
            import torch.distributed as dist

            dist.init_process_group(backend=order.backend)


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _is_ours(filename: str) -> bool:
    return os.path.abspath(filename).startswith(_PACKAGE_DIR)


def error_info(exc: BaseException) -> ErrorInfo:
    """Describe ``exc`` so that the notebook can re-raise it (see ``protocol.ErrorInfo``)."""
    tb = exc.__traceback__
    # Drop nbddp's own outer frames (serve, _call, the %%ddp cell program):
    # the user wants to see their code, starting where it was called.
    while tb is not None and _is_ours(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    exc_bytes: bytes | None
    try:
        data = tocpu.dumps(exc)
        pickle.loads(data)  # only ship what the notebook will be able to rebuild
        exc_bytes = data
    except Exception:
        exc_bytes = None
    return ErrorInfo(
        type_name=f"{type(exc).__module__}.{type(exc).__qualname__}",
        message=str(exc),
        traceback=text,
        exc_bytes=exc_bytes,
    )


def _call(order: RunOrder, fds: list[int]) -> Any:
    _prepare_torch(order)
    try:
        call = load_call(order.payload, fds)
    finally:
        for fd in fds:  # the mappings keep their own references
            os.close(fd)
    return call.fn(*call.args, **call.kwargs)


def serve(ctrl: socket.socket) -> int:
    """Run one order received on ``ctrl`` (see module contract); returns the exit code."""
    global CHANNEL
    set_process_name("nbddp-worker")
    msg = protocol.recv(ctrl)
    if msg is None or msg[0] != "run":
        return 1  # the notebook went away before sending work
    order: RunOrder = msg[1]
    fds: list[int] = []
    if order.fd_count:
        # Before the link watcher starts reading: it would swallow the descriptors.
        _, fds, _, _ = socket.recv_fds(ctrl, 1, order.fd_count)
    set_process_name(f"nbddp-rank{order.rank}")
    _apply_order(order)
    faulthandler.enable(file=sys.stderr, all_threads=True)
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    channel = CHANNEL = Channel(ctrl)
    threading.Thread(target=_watch_link, args=(ctrl,), name="nbddp-link", daemon=True).start()
    channel.send("started", os.getpid())
    try:
        value = _call(order, list(fds))
    except SystemExit as exc:
        return _report_exit(channel, exc)
    except BaseException as exc:
        # Not printed here: the notebook raises it once, with this traceback,
        # and adds it to the rank's log (printing it too would show it once
        # per failing rank in the cell's output).
        channel.send("error", error_info(exc))
        _flush()
        return 1
    # The process group is not destroyed here: the rank exits right after
    # (os._exit, no destructors), which is what torchrun's workers do too,
    # once every rank has returned (see _wait_for_peers).
    code = _report_result(channel, value)
    if code == 0:
        _wait_for_peers()
    return code


_RETURNED_KEY = "nbddp/returned"
_ALL_RETURNED_KEY = "nbddp/all_returned"
PEER_WAIT = 3.0  # seconds a returned rank waits for the others before exiting anyway


def _wait_for_peers() -> None:
    """Before a rank that returned exits, wait until every rank has returned.

    Exiting closes this rank's gloo/nccl connections, and a peer may still
    be using them: ``init_process_group`` returns on one rank while another
    is still completing the connection mesh (seen as "Gloo connectFullMesh
    failed ... Connection closed by peer" on a loaded machine, about one
    launch in five). So the ranks count themselves out in the process
    group's own store; the last one releases everybody. The wait is
    bounded by ``PEER_WAIT``: a peer still blocked in a collective this
    rank skipped (a bug in the function) must then see this rank leave and
    fail at once, as it would without nbddp, rather than hang. Only when
    the default group is still initialised (a function that destroyed it
    has nothing left to break); any store error just lets the rank exit.
    """
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return
    try:
        store = dist.distributed_c10d._get_default_store()
        if store.add(_RETURNED_KEY, 1) >= dist.get_world_size():
            store.set(_ALL_RETURNED_KEY, b"1")
        else:
            store.wait([_ALL_RETURNED_KEY], timedelta(seconds=PEER_WAIT))
    except Exception:
        pass  # e.g. a store hosted by a rank that already left: nothing to wait for


def _report_exit(channel: Channel, exc: SystemExit) -> int:
    code = exc.code
    if code is None or code == 0:
        channel.send("result", tocpu.dumps(None))
        _flush()
        _wait_for_peers()
        return 0
    if not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    channel.send("exit", code)
    _flush()
    return code


def _report_result(channel: Channel, value: Any) -> int:
    try:
        data = tocpu.dumps(value)
    except Exception as exc:
        err = TypeError(
            f"the return value ({type(value).__name__}) cannot be pickled: {exc}; "
            "return plain data (numbers, tensors, dicts) instead"
        )
        channel.send("error", error_info(err))
        _flush()
        return 1
    channel.send("result", data)
    _flush()
    return 0


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


def spawned_main() -> None:
    """Entry of a spawned worker: ``python -c "...spawned_main()" CTRL_FD``.

    The spawn starter already set the session, stdio and environment. This
    runs as ``nbddp.worker`` (not ``__main__``) so ``nbddp.log`` finds ``CHANNEL``.
    """
    ctrl = socket.socket(fileno=int(sys.argv[1]))
    code = serve(ctrl)
    _flush()
    # Why os._exit: like multiprocessing's children, a rank does not wait for
    # non-daemon threads the user's code left behind, nor run their atexit hooks.
    os._exit(code)
