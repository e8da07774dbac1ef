"""Starting one worker process: what every start method does, and spawn and fork.

A starter's ``start(fds, env)`` asks for a process in its own session with ``fds.out``/``fds.err``
as fd 1/2, running the worker on ``fds.ctrl``, and returns a ``Starting`` at once (a launch asks for
every rank, then waits for each). The ``Child``'s ``status_fd`` turns readable once, with the 8-byte
exit code (negative: a signal), when the rank's whole tree is gone; the rank's keeper reports it, so
a rank outlives its forkserver. The caller keeps ``fds`` and closes its copies after ``start``; a
``Starting`` it will not wait for is ``abandon``-ed. No start method re-imports ``__main__``.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from nbddp.forkserver import keeper
from nbddp.forkserver.keeper import STATUS
from nbddp.launcher.fds import NOTEBOOK_FDS

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
        """Wait for the worker's pid; raises, naming another start method, if it did not start."""

    def abandon(self) -> None:
        """Give the worker up without waiting: release what ``child`` would have read."""


class Starter(Protocol):
    """Starts workers one way."""

    def start(self, fds: ChildFds, env: dict[str, str]) -> Starting: ...


@dataclass(frozen=True)
class KeptStarting:
    """A worker whose keeper is the notebook's child: ``reap`` waits for the keeper,
    which reports on ``keeper_r`` (one of ``NOTEBOOK_FDS``, kept from other ranks).
    ``what`` the start method does, and the one to use ``instead``, name it in errors."""

    reap: Callable[[], object]
    keeper_r: int
    what: str
    instead: str

    def child(self) -> Child:
        """A thread reaps the keeper, then passes on the exit code; with no pid it
        raises (the keeper still reaped)."""
        try:
            rank = read_pid(self.keeper_r, FORKSERVER_REPLY_TIMEOUT)
        except BaseException:  # an interrupt: the rank will find its link closed and end
            self.abandon()
            raise
        if rank is None:
            self.abandon()
            raise RuntimeError(
                f"nbddp could not {self.what} (its error is on this process's stderr: the "
                f"kernel's log); use start_method={self.instead!r}"
            )
        status_r, status_w = os.pipe()
        NOTEBOOK_FDS.keep(status_r, status_w)
        threading.Thread(
            target=self._report, args=(status_w,), name="nbddp-reap", daemon=True
        ).start()
        return Child(rank, status_r)

    def abandon(self) -> None:
        close_kept(self.keeper_r)
        threading.Thread(target=self.reap, name="nbddp-reap", daemon=True).start()

    def _report(self, status_w: int) -> None:
        self.reap()
        try:
            code = os.read(self.keeper_r, STATUS.size)  # written before the keeper exited
            if len(code) == STATUS.size:  # else it was killed: the notebook reads EOF
                os.write(status_w, code)
        finally:
            close_kept(self.keeper_r)
            close_kept(status_w)


def package_pythonpath(env: dict[str, str]) -> str:
    """``PYTHONPATH`` for a fresh interpreter that must import this very nbddp."""
    root = str(Path(__file__).resolve().parent.parent)
    parts = [root, *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != root]]
    return os.pathsep.join(parts)


SPAWN_BOOT = "from nbddp.forkserver.keeper import spawned_main; spawned_main()"
"""A spawned keeper's program: it imports the standard library alone, then forks its rank."""


class SpawnStarter:
    """A fresh interpreter per rank, its keeper: slowest (imports torch each time), always safe."""

    def start(self, fds: ChildFds, env: dict[str, str]) -> Starting:
        keeper_r, keeper_w = os.pipe()
        NOTEBOOK_FDS.keep(keeper_r)
        passed = (fds.ctrl, fds.out, fds.err, keeper_w)
        try:
            proc = subprocess.Popen(
                [sys.executable, "-c", SPAWN_BOOT, *map(str, passed)],
                stdin=subprocess.DEVNULL,
                pass_fds=passed,
                env=dict(env, PYTHONPATH=package_pythonpath(env)),
                start_new_session=True,
            )
        except BaseException:
            close_kept(keeper_r)
            raise
        finally:
            os.close(keeper_w)
        return KeptStarting(proc.wait, keeper_r, "spawn a worker", "forkserver")


def read_pid(status_r: int, timeout: float) -> int | None:
    """The rank's pid, the first 8 bytes its keeper writes; None if none came in time."""
    ready, _, _ = select.select([status_r], [], [], timeout)
    data = os.read(status_r, STATUS.size) if ready else b""
    return int(STATUS.unpack(data)[0]) if len(data) == STATUS.size else None


def close_kept(fd: int) -> None:
    """Close ``fd``, one of ``NOTEBOOK_FDS``."""
    NOTEBOOK_FDS.release(fd)
    os.close(fd)


class ForkStarter:
    """Fork the notebook itself, as accelerate does: breaks if the notebook used CUDA."""

    def start(self, fds: ChildFds, env: dict[str, str]) -> Starting:
        status_r, status_w = os.pipe()
        with NOTEBOOK_FDS.frozen() as kept:
            pid = os.fork()
        if pid == 0:  # pragma: no cover - the child becomes the rank's keeper
            try:
                keeper.detach({*kept, status_r} - {fds.ctrl, fds.out, fds.err, status_w})
            except BaseException:
                traceback.print_exc()
                os._exit(1)
            keeper.keep(status_w, fds.ctrl, fds.out, fds.err)
        NOTEBOOK_FDS.keep(status_r)
        os.close(status_w)
        return KeptStarting(lambda: os.waitpid(pid, 0), status_r, "fork a worker", "spawn")
