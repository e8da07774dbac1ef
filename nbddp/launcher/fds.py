"""The file descriptors the notebook keeps for itself, which no forked rank may hold.

Contract: whoever opens an fd that must stay the notebook's alone (a rank's
link end and pipe read ends, its exit-status fd, the forkserver link) calls
``NOTEBOOK_FDS.keep`` at once, and ``release`` when it closes it. The fork
starter forks inside ``NOTEBOOK_FDS.frozen()``, which holds the lock across
the fork, so the child closes exactly the fds kept at that instant: none can
be added half-way, from the relay thread or another launch.

Why it matters: a rank that inherited another rank's pipe, or its own link's
notebook end, would keep those from ever reaching EOF, and the run would
never be seen to end. Only ``fork`` needs this (the forkserver and spawn
start from processes that never held these fds); it is one process-wide set
because runs overlap and the fork of any one of them copies them all.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class NotebookFds:
    """A thread-safe set of fds (see module contract)."""

    def __init__(self) -> None:
        self._fds: set[int] = set()
        self._lock = threading.Lock()

    def keep(self, *fds: int) -> None:
        """These fds are the notebook's own from now on."""
        with self._lock:
            self._fds.update(fds)

    def release(self, fd: int) -> None:
        """``fd`` is being closed: its number may name something else next."""
        with self._lock:
            self._fds.discard(fd)

    @contextmanager
    def frozen(self) -> Iterator[frozenset[int]]:
        """The fds kept now, unchanged until the block ends (fork inside it)."""
        with self._lock:
            yield frozenset(self._fds)


NOTEBOOK_FDS = NotebookFds()
