"""Starting one worker process: from nbddp's forkserver, by spawn, or by fork.

Contract: ``starter(config).start(fds, env)`` asks for a process that is the
leader of its own session, has ``fds.out``/``fds.err`` as fd 1/2 and runs
``worker.serve`` on ``fds.ctrl``. It returns a ``Starting`` at once, without
waiting for the process: a launch asks for all its ranks first and only then
waits for each (``Starting.child``), so that they are forked side by side. The
``Child`` has the pid and a ``status_fd`` that becomes readable once, with the
8-byte exit code (negative: killed by that signal), when the process has exited. Whatever the start
method, the rank's parent is its keeper (``nbddp.forkserver.keeper``): the code
arrives once the rank's whole tree is gone (a ``setsid`` daemon too), and
the keeper, not the forkserver, reports it, so a rank outlives its
forkserver. A spawned keeper is a fresh interpreter; a forked one is the
notebook's or the forkserver's child. The caller keeps
ownership of ``fds`` and closes its copies after ``start`` returns; a
``Starting`` it will not wait for is ``abandon``-ed (the process, if it
starts, finds its link closed and ends). From the
forkserver, each start also tells it the pool to keep (``pool_request``: the
config's world size and pool settings, validated when it was built).

Every start method runs the same worker (``worker.run_forked``) and none
re-imports ``__main__``: spawn execs ``python -c`` (never the user's script),
and fork/forkserver children go straight to the worker.
"""

from __future__ import annotations

import atexit
import os
import select
import socket
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, Protocol

from nbddp.forkserver import keeper
from nbddp.forkserver.keeper import STATUS
from nbddp.forkserver.server import REQUEST
from nbddp.launcher.execenv import fits_exec
from nbddp.launcher.fds import NOTEBOOK_FDS

if TYPE_CHECKING:
    # Only for types: the forkserver imports this module and needs none of the config.
    from nbddp.launcher.config import LaunchConfig

FORKSERVER_REPLY_TIMEOUT = 120.0


@dataclass(frozen=True)
class ChildFds:
    """The child's ends: its link to the notebook, and the stdout/stderr pipe write ends."""

    ctrl: int
    out: int
    err: int


@dataclass(frozen=True)
class Child:
    """A started worker: its pid and the fd that reports its exit code."""

    pid: int
    status_fd: int


class Starting(Protocol):
    """A worker asked for, whose pid may not have come yet."""

    def child(self) -> Child:
        """Wait for the worker's pid; raises if it did not start (the message says
        which start method to use instead)."""
        ...

    def abandon(self) -> None:
        """Give the worker up without waiting: release what ``child`` would have read."""
        ...


class Starter(Protocol):
    """Starts workers one way (see module contract)."""

    def start(self, fds: ChildFds, env: dict[str, str]) -> Starting:
        """Ask for one worker."""
        ...


@dataclass(frozen=True)
class KeptStarting:
    """A worker whose keeper is the notebook's child (``kept_child``)."""

    reap: Callable[[], object]
    keeper_r: int
    what: str
    instead: str

    def child(self) -> Child:
        """The worker, once its keeper has reported its pid."""
        return kept_child(self.reap, self.keeper_r, self.what, self.instead)

    def abandon(self) -> None:
        """Close the keeper's pipe; a thread still reaps the keeper."""
        _abandon(self.reap, self.keeper_r)


def package_pythonpath(env: dict[str, str]) -> str:
    """``PYTHONPATH`` for a fresh interpreter that must import this very nbddp."""
    root = str(Path(__file__).resolve().parent.parent)
    parts = [root, *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != root]]
    return os.pathsep.join(parts)


def forkserver_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The forkserver's environment: the notebook's, less any variable too long for
    ``execve`` (``execenv.fits_exec``).

    Why it may leave those out: the forkserver only imports torch with it; every
    rank it forks gets the notebook's whole environment in its run order. A
    variable too long would only make its ``execve`` fail with ``E2BIG``.
    """
    env = {key: value for key, value in environ.items() if fits_exec(key, value)}
    env["NBDDP_ROLE"] = "forkserver"
    env["PYTHONPATH"] = package_pythonpath(env)
    return env


SPAWN_BOOT = "from nbddp.forkserver.keeper import spawned_main; spawned_main()"
"""A spawned keeper's program: importing the lazy ``nbddp`` package and the keeper
costs the standard library alone, so the keeper forks its rank (which imports torch)
at once; the launch waits for each rank's pid."""


class SpawnStarter:
    """A fresh interpreter per rank: slowest (imports torch each time), always safe.

    The interpreter is the rank's keeper (``keeper.spawned_main``): it forks the
    rank and reports its pid and exit code on a status pipe given on its command line.
    """

    def start(self, fds: ChildFds, env: dict[str, str]) -> Starting:
        child_env = dict(env, PYTHONPATH=package_pythonpath(env))
        keeper_r, keeper_w = os.pipe()
        NOTEBOOK_FDS.keep(keeper_r)
        passed = (fds.ctrl, fds.out, fds.err, keeper_w)
        try:
            proc = subprocess.Popen(
                [sys.executable, "-c", SPAWN_BOOT, *map(str, passed)],
                stdin=subprocess.DEVNULL,
                pass_fds=passed,
                env=child_env,
                start_new_session=True,
            )
        except BaseException:
            _close(keeper_r)
            raise
        finally:
            os.close(keeper_w)
        return KeptStarting(proc.wait, keeper_r, "spawn a worker", "forkserver")


def run_kept_worker(fds: ChildFds, status_w: int, close: set[int]) -> NoReturn:
    """The body of a forked child (fork starter and forkserver): it becomes the rank's
    keeper, which forks the rank and reports to ``status_w``. Never returns."""
    try:
        keeper.detach(close - {fds.ctrl, fds.out, fds.err, status_w})
    except BaseException:
        traceback.print_exc()
        os._exit(1)
    rank_fds = (fds.ctrl, fds.out, fds.err)
    keeper.keep(lambda: _run_worker(*rank_fds), status_w, rank_fds)


def _run_worker(ctrl: int, out: int, err: int) -> NoReturn:  # pragma: no cover - in the rank
    from nbddp.rank import worker

    worker.run_forked(ctrl, out, err)


def read_pid(status_r: int, timeout: float) -> int | None:
    """The rank's pid, the first 8 bytes its keeper writes; None if none came in time."""
    ready, _, _ = select.select([status_r], [], [], timeout)
    data = os.read(status_r, STATUS.size) if ready else b""
    return int(STATUS.unpack(data)[0]) if len(data) == STATUS.size else None


def kept_child(reap: Callable[[], object], keeper_r: int, what: str, instead: str) -> Child:
    """The rank whose keeper is the notebook's child and reports on ``keeper_r``.

    A thread reaps the keeper (``reap``) and only then passes the rank's exit
    code on to the returned ``status_fd``: when the notebook sees a rank end,
    its keeper is gone too, and so is the thread a moment later. If no pid
    comes (the keeper failed, or an interrupt), it raises, and the keeper is
    still reaped. Every fd here is the notebook's own (``NOTEBOOK_FDS``): a
    rank forked meanwhile must not hold another's status.
    """
    try:
        rank = read_pid(keeper_r, FORKSERVER_REPLY_TIMEOUT)
    except BaseException:  # an interrupt: the rank will find its link closed and end
        _abandon(reap, keeper_r)
        raise
    if rank is None:
        _abandon(reap, keeper_r)
        raise RuntimeError(
            f"nbddp could not {what} (its error is on this process's stderr: the kernel's log); "
            f"use start_method={instead!r}"
        )
    status_r, status_w = os.pipe()
    NOTEBOOK_FDS.keep(status_r, status_w)
    args = (reap, keeper_r, status_w)
    threading.Thread(target=_reap_then_report, args=args, name="nbddp-reap", daemon=True).start()
    return Child(rank, status_r)


def _close(fd: int) -> None:
    NOTEBOOK_FDS.release(fd)
    os.close(fd)


def _abandon(reap: Callable[[], object], keeper_r: int) -> None:
    _close(keeper_r)
    threading.Thread(target=reap, name="nbddp-reap", daemon=True).start()


def _reap_then_report(reap: Callable[[], object], keeper_r: int, status_w: int) -> None:
    reap()
    try:
        code = os.read(keeper_r, STATUS.size)  # written before the keeper exited
        if len(code) == STATUS.size:  # else it was killed: the notebook reads EOF
            os.write(status_w, code)
    finally:
        _close(keeper_r)
        _close(status_w)


class ForkStarter:
    """Fork the notebook itself, as accelerate does: breaks if the notebook used CUDA."""

    def start(self, fds: ChildFds, env: dict[str, str]) -> Starting:
        status_r, status_w = os.pipe()
        with NOTEBOOK_FDS.frozen() as kept:
            pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            run_kept_worker(fds, status_w, {*kept, status_r})
        NOTEBOOK_FDS.keep(status_r)
        os.close(status_w)
        return KeptStarting(lambda: os.waitpid(pid, 0), status_r, "fork a worker", "spawn")


@dataclass(frozen=True)
class PoolRequest:
    """What the forkserver keeps after forking a launch's ranks."""

    size: int
    """Idle workers to keep (0: none)."""
    idle: float
    """Seconds without a launch before they end."""


def pool_request(config: LaunchConfig) -> PoolRequest:
    """The pool to ask the forkserver for while starting ``config``'s ranks.

    The pool is sized to the launch (its world size: the processes it starts
    on this machine), capped by ``config.pool_max`` (``NBDDP_POOL``; 0 turns
    the pool off). ``config.pool_idle`` (``NBDDP_POOL_IDLE``) is how long idle
    workers wait for the next launch. Both were read, and checked, when the
    config was built.
    """
    return PoolRequest(min(config.world_size, config.pool_max), config.pool_idle)


class ForkserverStarter:
    """Fork from the forkserver: a server process with torch imported that never touches CUDA.

    One forkserver per notebook process, started on first use (or by
    ``prewarm``). It exits when the notebook closes the link or dies.
    Each request also tells it how large a pool of idle workers to keep
    (a ``PoolRequest``; see ``nbddp.forkserver.pool``).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._asked = False  # whether this forkserver was ever sent a request
        self._exit_hook = False  # close() is registered to run at interpreter exit

    @property
    def pid(self) -> int | None:
        """The forkserver's pid while it runs."""
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
        # Only here, on the notebook's side: the forkserver imports this module too.
        from nbddp.launcher.config import first_pool

        size, idle = first_pool(os.environ)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with theirs:
                self._proc = subprocess.Popen(
                    [
                        sys.executable,
                        "-c",
                        "import nbddp.forkserver.server as s; s.main()",
                        str(theirs.fileno()),
                        str(size),
                        str(idle),
                    ],
                    stdin=subprocess.DEVNULL,
                    pass_fds=(theirs.fileno(),),
                    env=env,
                    start_new_session=True,  # Ctrl-C in a terminal is ours to handle, not its
                )
        except OSError as exc:
            ours.close()
            raise RuntimeError(
                f"nbddp's forkserver could not start ({exc.strerror or exc}); "
                "use start_method='fork', or fix what the error names and retry"
            ) from exc
        self._sock = ours
        self._asked = False
        NOTEBOOK_FDS.keep(ours.fileno())
        if not self._exit_hook:
            atexit.register(self.close)
            self._exit_hook = True
        return ours

    def fork(self, fds: ChildFds, pool: PoolRequest) -> ForkserverStarting:
        """Ask the forkserver for one worker; afterwards it keeps ``pool``. Returns once
        the request is sent: the pid comes on the returned ``status_r``."""
        with self._lock:
            for attempt in (1, 2):
                request = REQUEST.pack(b"F", pool.size, pool.idle)
                sock = self._ensure_running()
                status_r, status_w = os.pipe()
                self._asked = True
                try:
                    socket.send_fds(sock, [request], [status_w, fds.ctrl, fds.out, fds.err])
                except OSError:
                    os.close(status_r)
                    os.close(status_w)
                    self._close_locked()  # the forkserver died: start a new one once
                    if attempt == 2:
                        raise
                    continue
                os.close(status_w)
                NOTEBOOK_FDS.keep(status_r)
                return ForkserverStarting(self, status_r)
        raise AssertionError("unreachable")

    def read_pid(self, status_r: int) -> int:
        """The pid of the worker asked for with ``status_r``; raises if none comes
        (``status_r`` is then closed, and so is this forkserver)."""
        # Why a timeout: the first request waits for the forkserver's torch import
        # (seconds); a forkserver that never answers must not hang the notebook.
        try:
            pid = read_pid(status_r, FORKSERVER_REPLY_TIMEOUT)
        except BaseException:  # an interrupt while it starts: the rank will find its link closed
            _close(status_r)
            raise
        if pid is None:
            _close(status_r)
            self.close()
            raise RuntimeError(
                "nbddp's forkserver did not start a worker (see the kernel's log); "
                "retry, or use start_method='spawn'"
            )
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
            if not self._asked:
                # Never asked, it has forked nothing, and it may still be seconds
                # into its torch import, before it reads the closed link: waiting
                # for that made a script that never launched take seconds to exit.
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
        """The worker, once its pid has come."""
        return Child(self.server.read_pid(self.status_r), self.status_r)

    def abandon(self) -> None:
        """Close the status pipe: the worker, if forked, finds its link closed and ends."""
        _close(self.status_r)


@dataclass(frozen=True)
class ForkserverLaunch:
    """The forkserver as one launch's starter: every rank it starts asks for ``pool``."""

    server: ForkserverStarter
    pool: PoolRequest

    def start(self, fds: ChildFds, env: dict[str, str]) -> Starting:
        del env  # the rank's environment travels in its run order, not through the forkserver
        return self.server.fork(fds, self.pool)


def starter(config: LaunchConfig) -> Starter:
    """The starter for ``config``'s start method (validated by ``LaunchConfig``)."""
    method = config.start_method
    if method == "forkserver":
        return ForkserverLaunch(FORKSERVER, pool_request(config))
    if method == "spawn":
        return SpawnStarter()
    if method == "fork":
        return ForkStarter()
    raise ValueError(f"unknown start method {method!r}")
