"""Finding nbddp processes this test session started, to prove none is left behind.

Every process nbddp starts inherits the notebook's environment, so the
marker ``NBDDP_TEST_SESSION`` set by ``conftest.py`` identifies our workers
(and kernels and zygotes started by tests) even after they were orphaned,
and keeps other test sessions on the same machine out of the count.
"""

from __future__ import annotations

import os

import psutil

MARKER = "NBDDP_TEST_SESSION"


def ours(roles: tuple[str, ...] = ("worker",)) -> list[psutil.Process]:
    """Live processes of this test session whose ``NBDDP_ROLE`` is in ``roles``."""
    session = os.environ[MARKER]
    found = []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        try:
            env = proc.environ()
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if env.get(MARKER) == session and env.get("NBDDP_ROLE") in roles:
            found.append(proc)
    return found


def wait_gone(roles: tuple[str, ...] = ("worker",), timeout: float = 10.0) -> list[psutil.Process]:
    """Wait until no such process is left (event-driven: psutil.wait_procs); return survivors."""
    procs = ours(roles)
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    return [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
