"""Finding the nbddp processes this test session started, to prove none is left behind.

A process is nbddp's when it is named ``nbddp-*`` (ranks name themselves
``nbddp-rank<N>``, the forkserver ``nbddp-zygote``) or when its environment
at exec time has ``NBDDP_ROLE`` (spawned ranks, and everything forked from
the zygote: ranks and their DataLoader workers, which rename themselves).
It is this session's when it descends from the test process, or when that
exec-time environment carries ``NBDDP_TEST_SESSION`` (set by
``conftest.py``; kernels started by tests and their zygotes inherit it),
which still holds for orphans. Other sessions on the machine are ignored.
Zombies count as gone: in some containers nothing reaps orphans.
"""

from __future__ import annotations

import os
import time
from collections.abc import Collection

import psutil

MARKER = "NBDDP_TEST_SESSION"
ZYGOTE_NAME = "nbddp-zygote"


def _descendants() -> set[int]:
    try:
        return {p.pid for p in psutil.Process().children(recursive=True)}
    except psutil.Error:
        return set()


def ours(
    roles: tuple[str, ...] = ("worker",), pids: Collection[int] | None = None
) -> list[psutil.Process]:
    """Live processes of this test session with one of ``roles``.

    ``zygote``: nbddp's forkserver; ``worker``: every other nbddp process
    (ranks and their children). With ``pids``, only those processes (e.g.
    what one kernel started)."""
    session = os.environ[MARKER]
    mine = _descendants()
    found = []
    for proc in psutil.process_iter():
        if pids is not None and proc.pid not in pids:
            continue
        try:
            if proc.pid == os.getpid() or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            name, env = proc.name(), proc.environ()
            if not (name.startswith("nbddp-") or "NBDDP_ROLE" in env):
                continue
            role = "zygote" if name == ZYGOTE_NAME else "worker"
            if role in roles and (proc.pid in mine or env.get(MARKER) == session):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_procs_gone(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait until every process in ``procs`` is gone or a zombie; return the survivors.

    psutil.wait_procs alone would wait out the timeout on orphaned zombies
    that nothing reaps, so it is called in short slices between checks.
    """
    deadline = time.monotonic() + timeout
    alive = [p for p in procs if _alive(p)]
    while alive and time.monotonic() < deadline:
        psutil.wait_procs(alive, timeout=min(0.1, max(0.0, deadline - time.monotonic())))
        alive = [p for p in alive if _alive(p)]
    return alive


def wait_gone(
    roles: tuple[str, ...] = ("worker",),
    timeout: float = 10.0,
    pids: Collection[int] | None = None,
) -> list[psutil.Process]:
    """Wait until no process of this session with ``roles`` is left; return survivors."""
    return wait_procs_gone(ours(roles, pids), timeout)
