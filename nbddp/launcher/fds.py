"""The file descriptors the notebook keeps for itself, which no forked rank may hold.

Whoever opens an fd that must stay the notebook's alone calls ``NOTEBOOK_FDS.keep`` at once and
``release`` when closing it. The fork starter forks inside ``NOTEBOOK_FDS.frozen()`` and the child
closes exactly those fds: a rank holding another's pipe would keep it from ever reaching EOF.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class NotebookFds:
    """A thread-safe set of fds."""

    def __init__(self) -> None:
        self._fds: set[int] = set()
        self._lock = threading.Lock()
        # A forked child lacks the thread that held the lock at the fork, if any: a new lock.
        os.register_at_fork(after_in_child=lambda: setattr(self, "_lock", threading.Lock()))

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
