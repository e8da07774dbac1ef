"""The forkserver's keepers, and the idle workers they hold for the next launch.

A ``Pool`` lives in the single-threaded forkserver and owns its children, each a keeper
(``keeper.serve_keeper``) on a private socketpair link, busy (its rank runs) or free, and warm
when it holds an idle worker. ``size`` is the last launch's rank count, capped by ``NBDDP_POOL``;
once no rank has started or ended for ``REFILL_DELAY`` seconds, keepers are warmed one at a time
(never slowing a rank); after ``idle_timeout`` seconds without a launch every free keeper ends.
Free keepers die with the forkserver, idle workers with their keeper.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass

from nbddp.forkserver import keeper

REFILL_DELAY = 0.1
"""Seconds without a rank starting or ending before the pool is refilled."""


@dataclass
class _Keeper:
    """A keeper this forkserver forked: its end of the keeper's link."""

    link: socket.socket
    warm: bool = False
    """Free and holding an idle worker."""


class Pool:
    def __init__(self, selector: selectors.BaseSelector) -> None:
        self.size = 0  # warm keepers to keep: the last launch's, 0 until the first
        self.idle_timeout = 0.0
        self.free: dict[int, _Keeper] = {}  # pid -> keeper, oldest first
        self.busy: dict[int, _Keeper] = {}  # pid -> keeper of a running rank
        self.ending: set[int] = set()  # pids told to end (or that died), not yet reaped
        self.last_used = time.monotonic()  # the last request or rank exit
        self._selector = selector  # every link is in it, with its keeper's pid as data

    def fds(self) -> set[int]:
        """The forkserver's ends of the keepers' links, which every child it forks must
        close (a keeper would otherwise never see EOF when it is ended)."""
        return {k.link.fileno() for k in (*self.free.values(), *self.busy.values())}

    def warm(self) -> int:
        """Free keepers holding an idle worker."""
        return sum(k.warm for k in self.free.values())

    def resize(self, size: int, idle_timeout: float) -> None:
        """A launch asked for ``size`` idle workers from now on; end free keepers beyond."""
        self.size, self.idle_timeout = size, idle_timeout
        self.last_used = time.monotonic()
        while len(self.free) > size:
            cold = [pid for pid, k in self.free.items() if not k.warm]
            self._end((cold or list(self.free))[-1])  # the youngest, cold first

    def hand_over(self, fds: Sequence[int]) -> int | None:
        """Give a rank's fds to a free keeper, warm first; its pid, or None if none is
        free. The caller keeps its own copies of ``fds``."""
        while self.free:
            pid = next((p for p, k in self.free.items() if k.warm), next(iter(self.free)))
            found = self.free.pop(pid)
            try:
                socket.send_fds(found.link, [keeper.RUN], list(fds))
            except OSError:  # it died while free (the reaper will collect it)
                self._drop(pid, found)
                continue
            found.warm = False
            self.busy[pid] = found
            return pid
        return None

    def start_keeper(self, close: set[int], fds: Sequence[int] | None) -> int:
        """Fork a keeper, busy with the rank on ``fds``, or with None, free and warm.
        ``close``: the forkserver's own fds, which the keeper must not keep. Its pid."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        forkserver = os.getpid()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the keeper
            with keeper.in_child():
                keeper.detach({*close, *self.fds()})
                ours.close()
            keeper.serve_keeper(theirs, forkserver, None if fds is None else list(fds), fds is None)
        theirs.close()
        found = _Keeper(ours, warm=fds is None)
        (self.busy if fds is not None else self.free)[pid] = found
        self._selector.register(ours, selectors.EVENT_READ, pid)
        return pid

    def refill_in(self) -> float | None:
        """Seconds until a refill is due (0: now); None while none will be."""
        if self.busy or self.warm() >= self.size:
            return None
        return max(0.0, self.last_used + REFILL_DELAY - time.monotonic())

    def warm_one(self, close: set[int]) -> None:
        """Make one more keeper warm: a cold free one forks its idle worker, or else a
        new warm keeper is forked; ``close``: as for ``start_keeper``."""
        cold = next((pid for pid, k in self.free.items() if not k.warm), None)
        if cold is None:
            self.start_keeper(close, None)
            return
        found = self.free[cold]
        try:
            found.link.sendall(keeper.WARM)
        except OSError:  # it died while free (the reaper will collect it)
            self._drop(cold, self.free.pop(cold))
            return
        found.warm = True

    def heard(self, pid: int, listening: bool) -> None:
        """A keeper's link is readable: it is free again (kept if ``listening`` and
        fewer than ``size`` are free, else ended), or it closed (it died)."""
        found = self.busy.get(pid) or self.free.get(pid)
        if found is None:
            return
        try:
            said = found.link.recv(1)
        except OSError:
            said = b""
        if said != keeper.FREE or pid not in self.busy:
            self.busy.pop(pid, None)
            self.free.pop(pid, None)
            self._drop(pid, found)
            return
        self.last_used = time.monotonic()
        self.free[pid] = self.busy.pop(pid)
        if not listening or len(self.free) > self.size:
            self._end(pid)

    def wind_down_in(self) -> float | None:
        """Seconds until free keepers end for want of launches; None when none is free."""
        if not self.free:
            return None
        return max(0.0, self.last_used + self.idle_timeout - time.monotonic())

    def wind_down(self) -> None:
        """End every free keeper and keep none until the next launch says how many."""
        self.size = 0
        for pid in list(self.free):
            self._end(pid)

    def forget(self, pid: int) -> bool:
        """A child exited (reaped): True if it was one of the keepers."""
        if pid in self.ending:
            self.ending.discard(pid)
            return True
        found = self.free.pop(pid, None)
        if found is not None:
            # It died while free: not replaced until the next launch says so, so a
            # worker that cannot start is not forked in a loop.
            self._close(found)
            self.size = min(self.size, self.warm())
            return True
        found = self.busy.pop(pid, None)
        if found is None:
            return False  # an orphan a killed keeper left, re-parented here
        self._close(found)  # killed while keeping a rank: its link tells the notebook
        self.last_used = time.monotonic()
        return True

    def _end(self, pid: int) -> None:
        # SIGKILL as well as EOF: a free keeper holds no run, and the forkserver waits
        # for it before exiting. Not reaped yet, so the pid is still this child.
        self._drop(pid, self.free.pop(pid))

    def _drop(self, pid: int, found: _Keeper) -> None:
        """A keeper whose link failed or said something else than ``FREE``: ended."""
        self._close(found)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        self.ending.add(pid)

    def _close(self, found: _Keeper) -> None:
        self._selector.unregister(found.link)
        found.link.close()
