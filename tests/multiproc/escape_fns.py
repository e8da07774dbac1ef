"""Rank functions that try to leave processes behind, for ``test_escapes``.

Workers import this module by reference (it is on the notebook's sys.path).
Each escaped process blocks until it is killed; each function returns (or
prints) the escaped process's pid so that the test can look for it.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import NoReturn


def _block_forever() -> NoReturn:
    while True:
        signal.pause()


def noop() -> int:
    """Return 0."""
    return 0


def setsid_child_holding_pipes() -> int:
    """Fork a child that leaves the rank's session and keeps every fd the rank has
    (its stdout/stderr pipes and its link): return the child's pid."""
    pid = os.fork()
    if pid == 0:
        os.setsid()
        _block_forever()
    return pid


def double_fork_with_pipes_closed() -> int:
    """Double-fork a daemon (new session, its parent gone, every inherited fd closed):
    return the daemon's pid."""
    r, w = os.pipe()
    first = os.fork()
    if first == 0:
        os.setsid()
        if os.fork() == 0:
            os.write(w, f"{os.getpid()}\n".encode())
            os.closerange(0, 1 << 16)
            _block_forever()
        os._exit(0)
    os.close(w)
    os.waitpid(first, 0)
    with os.fdopen(r) as f:
        return int(f.readline())


def escape_then_hang() -> None:
    """Leave a setsid child behind, say its pid on stdout, then hang."""
    pid = setsid_child_holding_pipes()
    print(f"escaped {pid}", flush=True)
    _block_forever()


def wait_then_exit(path: str, code: int) -> str:
    """Print 'ready', wait for a line in the FIFO ``path.RANK``, then exit with ``code``
    on rank 1 (rank 0 returns the line)."""
    rank = os.environ["RANK"]
    print(f"ready {rank}", flush=True)
    with open(f"{path}.{rank}") as fifo:
        line = fifo.readline().strip()
    if rank == "1" and code:
        sys.stdout.flush()
        os._exit(code)
    return line
