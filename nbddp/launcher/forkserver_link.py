"""The notebook's link to nbddp's forkserver: it starts the forkserver and asks it for ranks.

``FORKSERVER`` is this process's one forkserver, started on first use (or by ``prewarm``) with
``forkserver_env``; it exits when this end of its link closes. ``fork(fds, pool)`` asks it for one
rank, whose keeper reports the pid on the returned ``status_r``; each request also says what pool to
keep (``pool_request``). ``ForkserverLaunch`` is it as one launch's ``Starter``.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from nbddp.forkserver.server import REQUEST
from nbddp.launcher import settings
from nbddp.launcher.config import DEFAULT_CPU_PROCS, JobSpec
from nbddp.launcher.devices import visible_gpus
from nbddp.launcher.execenv import fits_exec
from nbddp.launcher.fds import NOTEBOOK_FDS
from nbddp.launcher.starters import (
    FORKSERVER_REPLY_TIMEOUT,
    Child,
    ChildFds,
    Starting,
    close_kept,
    package_pythonpath,
    read_pid,
)
from nbddp.wire.descriptors import OwnedFd


def forkserver_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The notebook's environment less any variable too long for ``execve`` (``E2BIG``);
    its ranks still get the whole environment with each request."""
    env = {key: value for key, value in environ.items() if fits_exec(key, value)}
    env["NBDDP_ROLE"] = "forkserver"
    env["PYTHONPATH"] = package_pythonpath(env)
    return env


def first_pool(environ: Mapping[str, str]) -> tuple[int, float]:
    """(idle workers, seconds they wait) for a new forkserver to keep before any launch has said: as
    many as a launch with no options starts (every visible GPU, else ``DEFAULT_CPU_PROCS``), within
    ``NBDDP_POOL``; none where the settings are wrong (the launch then says what is wrong)."""
    try:
        chosen = settings.read(environ)
    except ValueError:
        return 0, 0.0
    return min(chosen.pool, len(visible_gpus(environ)) or DEFAULT_CPU_PROCS), chosen.pool_idle


@contextlib.contextmanager
def interrupts_after() -> Iterator[None]:
    """Hold a Ctrl-C that comes during the block and raise it after (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: held.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if held:
        raise KeyboardInterrupt


@dataclass(frozen=True)
class PoolRequest:
    """What the forkserver keeps after forking a launch's ranks."""

    size: int  # idle workers to keep (0: none)
    idle: float  # seconds without a launch before they end


def pool_request(spec: JobSpec, ranks: int) -> PoolRequest:
    """The pool to ask for while starting ``ranks`` ranks, capped by ``spec.pool_max``."""
    return PoolRequest(min(ranks, spec.pool_max), spec.pool_idle)


class ForkserverStarter:
    """Fork from the forkserver: a server process with torch imported that never touches CUDA."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # renewed in a forked child: see ``NOTEBOOK_FDS``
        os.register_at_fork(after_in_child=lambda: setattr(self, "_lock", threading.Lock()))
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._answered = False  # whether this forkserver ever forked a rank we know of
        self._exit_hook = False  # close() is registered to run at interpreter exit

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def prewarm(self) -> None:
        """Start the forkserver now so that its torch import overlaps the user's work."""
        with self._lock:
            self._ensure_running()

    def _ensure_running(self) -> socket.socket:
        if self._sock is not None and self._proc is not None and self._proc.poll() is None:
            return self._sock
        self._close_locked()
        env = forkserver_env(os.environ)
        size, idle = first_pool(os.environ)
        # Why interrupts wait: one landing in Popen, after the fork, would leave a
        # forkserver that nobody holds, and this end of its link open with it.
        with interrupts_after():
            return self._start(env, size, idle)

    def _start(self, env: dict[str, str], size: int, idle: float) -> socket.socket:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        argv = (str(theirs.fileno()), str(size), str(idle))  # see ``server.main``
        try:
            with theirs:
                self._proc = subprocess.Popen(
                    [sys.executable, "-c", "import nbddp.forkserver.server as s; s.main()", *argv],
                    stdin=subprocess.DEVNULL,
                    pass_fds=(theirs.fileno(),),
                    env=env,
                    start_new_session=True,  # Ctrl-C in a terminal is ours to handle, not its
                )
        except BaseException as exc:
            ours.close()
            if not isinstance(exc, OSError):
                raise
            raise RuntimeError(
                f"nbddp's forkserver could not start ({exc.strerror or exc}); "
                "use start_method='fork', or fix what the error names and retry"
            ) from exc
        self._sock = ours
        self._answered = False
        NOTEBOOK_FDS.keep(ours.fileno())
        if not self._exit_hook:
            atexit.register(self.close)
            self._exit_hook = True
        return ours

    def fork(self, fds: ChildFds, pool: PoolRequest) -> ForkserverStarting:
        """Ask for one worker, then keep ``pool``; returns once sent (the pid comes later)."""
        request = REQUEST.pack(b"F", pool.size, pool.idle)
        with self._lock:
            for attempt in (1, 2):
                sock = self._ensure_running()
                status_r, status_w = os.pipe()
                try:
                    socket.send_fds(sock, [request], [status_w, fds.ctrl, fds.out, fds.err])
                    break
                except OSError:
                    os.close(status_r)
                    os.close(status_w)
                    self._close_locked()  # the forkserver died: start a new one once
                    if attempt == 2:
                        raise
            os.close(status_w)
            NOTEBOOK_FDS.keep(status_r)
            return ForkserverStarting(self, status_r)

    def serve_store(self, sock: socket.socket) -> OwnedFd:
        """A child of the forkserver serves a rendezvous store on ``sock`` (closed here)
        until the descriptor returned is closed."""
        end, ours = os.pipe()
        store = OwnedFd(ours)  # closed with it if the request fails
        with self._lock, sock:
            try:
                request = REQUEST.pack(b"S", 0, 0.0)
                socket.send_fds(self._ensure_running(), [request], [sock.fileno(), end])
            finally:
                os.close(end)
        return store

    def read_pid(self, status_r: int) -> int:
        """The pid of the worker asked for with ``status_r``; if none comes, closes both, raises."""
        # Why a timeout: the first request waits for the forkserver's torch import
        # (seconds); a forkserver that never answers must not hang the notebook.
        try:
            pid = read_pid(status_r, FORKSERVER_REPLY_TIMEOUT)
        except BaseException:  # an interrupt while it starts: the rank will find its link closed
            close_kept(status_r)
            raise
        if pid is None:
            close_kept(status_r)
            self.close()
            raise RuntimeError(
                "nbddp's forkserver did not start a worker (see the kernel's log); "
                "retry, or use start_method='spawn'"
            )
        self._answered = True
        return pid

    def close(self) -> None:
        """Stop the forkserver (running workers are not affected)."""
        with self._lock:
            self._close_locked()

    def _close_locked(self) -> None:
        if self._sock is not None:
            NOTEBOOK_FDS.release(self._sock.fileno())
            self._sock.close()
            self._sock = None
        if self._proc is not None:
            if not self._answered:
                # No rank of ours yet: waiting out its torch import would hold exit up by
                # seconds, and a notebook killed meanwhile (slow kernel shutdown) would leave it.
                self._proc.kill()
            try:
                self._proc.wait(timeout=5)  # it ends its idle workers, waits for its ranks
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None


FORKSERVER = ForkserverStarter()


@dataclass(frozen=True)
class ForkserverStarting:
    """A worker asked of the forkserver; its keeper writes the pid to ``status_r``."""

    server: ForkserverStarter
    status_r: int

    def child(self) -> Child:
        return Child(self.server.read_pid(self.status_r), self.status_r)

    def abandon(self) -> None:
        """Close the status pipe: the worker, if forked, finds its link closed and ends."""
        close_kept(self.status_r)


@dataclass(frozen=True)
class ForkserverLaunch:
    """The forkserver as one launch's starter: every rank it starts asks for ``pool``."""

    server: ForkserverStarter
    pool: PoolRequest

    def start(self, fds: ChildFds, env: dict[str, str]) -> Starting:
        del env  # the rank's environment travels in its run order, not through the forkserver
        return self.server.fork(fds, self.pool)
