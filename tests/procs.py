"""Finding nbddp processes this test session started, to prove none is left behind.

Every process nbddp starts inherits the notebook's environment, so the
marker ``NBDDP_TEST_SESSION`` set by ``conftest.py`` identifies our workers
(and kernels and zygotes started by tests) even after they were orphaned,
and keeps other test sessions on the same machine out of the count. A
forked rank reports its parent's environment to other processes, so its
role comes from its process name (``nbddp-worker``) instead.
"""

from __future__ import annotations

import os
from collections.abc import Collection

import psutil

from nbddp.starters import WORKER_NAME

MARKER = "NBDDP_TEST_SESSION"


def ours(
    roles: tuple[str, ...] = ("worker",), pids: Collection[int] | None = None
) -> list[psutil.Process]:
    """Live processes of this test session whose ``NBDDP_ROLE`` is in ``roles``.

    With ``pids``, only those processes (e.g. what one kernel started).
    """
    session = os.environ[MARKER]
    found = []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid() or (pids is not None and proc.pid not in pids):
            continue
        try:
            env = proc.environ()
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if env.get(MARKER) == session and _role(proc, env) in roles:
            found.append(proc)
    return found


def _role(proc: psutil.Process, env: dict[str, str]) -> str | None:
    # A forked rank (forkserver, fork) shows its parent's environment in
    # /proc/PID/environ, so NBDDP_ROLE there reads "zygote" (or nothing);
    # nbddp names such ranks WORKER_NAME instead.
    try:
        if proc.name() == WORKER_NAME:
            return "worker"
    except psutil.Error:
        return None
    return env.get("NBDDP_ROLE")


def wait_gone(
    roles: tuple[str, ...] = ("worker",),
    timeout: float = 10.0,
    pids: Collection[int] | None = None,
) -> list[psutil.Process]:
    """Wait until no such process is left (event-driven: psutil.wait_procs); return survivors."""
    procs = ours(roles, pids)
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    return [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
