"""What an nbddp process asks the kernel about itself: its name, its orphans, its parent.

``set_name`` names every nbddp process for ``ps`` and the tests; ``become_subreaper`` lets a
keeper adopt its rank's orphans; ``die_with`` (free keepers, idle workers) and
``outlive_parent`` (ranks, their keepers) set the parent-death signal. Best effort: off Linux
they do nothing. ``flush_output`` flushes Python's then C's stdio. Only the standard library.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
PR_SET_CHILD_SUBREAPER = 36


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def _prctl(option: int, value: int | bytes) -> bool:
    prctl = getattr(_libc(), "prctl", None)
    return prctl is not None and int(prctl(option, value, 0, 0, 0)) == 0


def set_name(name: str) -> None:
    """Name this process (``ps``, ``top``, psutil's ``name()``; 15 bytes at most);
    its children inherit the name until they set their own."""
    _prctl(PR_SET_NAME, name.encode()[:15])


def become_subreaper() -> bool:
    """Have orphaned descendants re-parented to this process; False where the kernel
    cannot (they go to init then)."""
    return _prctl(PR_SET_CHILD_SUBREAPER, 1)


def die_with(parent: int) -> None:
    """Be killed when ``parent`` (this process's parent) exits; exit now if it
    already has (before this call took effect)."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(0)


def outlive_parent() -> None:
    """Undo ``die_with``: this process's life no longer follows its parent's."""
    _prctl(PR_SET_PDEATHSIG, 0)


def flush_output() -> None:
    """Flush ``sys.stdout``, ``sys.stderr`` (a closed or broken one is skipped), then
    every C stdio stream (``fflush(NULL)``): all this process printed leaves it now."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    libc = _libc()
    if libc is not None:
        libc.fflush(None)
