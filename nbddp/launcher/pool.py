"""The forkserver's keepers, and its pool of idle one-shot workers.

Contract: a ``Pool`` lives in the forkserver (single-threaded, like the
forkserver) and owns its children: every one is a keeper
(``nbddp.rank.pooled``) with a private socketpair link to the forkserver,
and is either busy (keeping a rank) or free. A free keeper may hold an idle
worker, forked ahead of time, that has already done what a forked rank does
first (its own session, the forkserver's fds closed, default signals),
warmed up, and blocks on a socketpair to its keeper: a warm keeper. Free
keepers and idle workers are named ``nbddp-idle``.

``hand_over`` sends one rank's fds (ctrl, out, err, status) to the oldest
warm keeper, else the oldest free one, and returns its pid; the keeper
passes the first three to its worker (or forks the rank now) and keeps the
status fd. ``start_keeper`` forks a new keeper for a rank when none is free.
When its rank and the rank's whole tree are gone, the keeper says it is free
again (``heard``), and stays for the next rank if fewer than ``size`` are
free, or is ended. A worker never runs two jobs, so no state (module
globals, environment, ``sys.modules``, a process group) passes from one run
to the next; a keeper runs none of the user's code, so it carries none.

Sizing is the forkserver's call (``resize`` on each request, ``warm_one``
when a refill is due, ``wind_down`` after ``idle_timeout`` seconds without
a launch); when a refill is due is ``refill_wait``'s (a pure function):
during a run only where the machine has a core its ranks leave spare, and
otherwise once no rank has run for a moment. A refill warms a free keeper
(one fork, in that keeper) or forks a new warm one, and never makes more than
the last launch's size warm: at most what one more launch needs. Keepers
forked before the forkserver moved its memory into huge pages no longer
share it, and are ended once free (``renew``; ``nbddp.launcher.hugepages``).

A free keeper exits on its own when its link closes (the forkserver ended
it, exited, or died) and the kernel kills it if the forkserver dies first
(``PR_SET_PDEATHSIG``), as it kills the worker if its keeper dies: idle
processes never outlive the forkserver.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import socket
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from nbddp.launcher.starters import detach
from nbddp.rank import pooled

REFILL_DELAY = 0.1
"""Seconds without a request or a rank exit before a refill, where the ranks take every core."""
SETTLE = 0.02
"""Seconds without a request before a refill while ranks run: a launch sends its
requests one right after another, and a fork between two delays the next rank."""
STALLED = 0.1
"""The share of time tasks may have waited for CPU for a core to count as spare
(``NBDDP_POOL_STALL`` in the forkserver's environment; 1 counts cores alone)."""


def stall_limit(environ: Mapping[str, str]) -> float:
    """``NBDDP_POOL_STALL`` when it is a share from 0 to 1, else ``STALLED``."""
    try:
        value = float(environ.get("NBDDP_POOL_STALL", STALLED))
    except ValueError:
        return STALLED
    return value if 0.0 <= value <= 1.0 else STALLED


def refill_wait(
    *,
    short: bool,
    running: int,
    cores: int,
    since_request: float,
    since_active: float,
    stalled: float = 0.0,
    stall_limit: float = STALLED,
) -> float | None:
    """Seconds until the next refill fork is due (0: now); None while none will be.

    ``short``: the pool holds fewer idle workers than the last launch asked for;
    ``running``: ranks of this forkserver running now; ``cores``: the cores it may
    use; ``since_request``/``since_active``: seconds since the last request, and
    since the last request or rank exit; ``stalled``: the share of the time since
    the last request in which some task on the machine waited for a CPU (0 where
    the kernel does not say: ``cpu_stall_us``).

    A refill costs CPU: a fork (milliseconds: the page tables of a process with
    torch imported; in a free keeper, or of the forkserver for a new one), and
    the worker's warm-up. Where a core is spare (``running < cores``: a GPU machine
    with 16 cores and 8 ranks), that CPU is not the run's, so the pool refills
    as soon as the launch's ranks have all been started (``SETTLE``): a launch
    that follows the run at once, as in a sweep's loop, then finds it full.
    A core is not spare if tasks have been waiting for CPU (``stalled`` over
    ``stall_limit``: other work, a rank's DataLoader workers), whatever the count.
    Where the ranks take every core (2 ranks on 2 cores), a refill during the
    run would take CPU from the training job, and right after it would compete
    with a launch that follows at once: it waits until no rank has run for
    ``REFILL_DELAY`` (a notebook user's next launch comes seconds later and finds
    the pool full; a loop's is served by plain forks, as with the pool off).
    ``running`` counts ranks, not what they start (DataLoader workers): the
    refill is bounded anyway, to one launch's worth of workers.
    """
    if not short:
        return None
    if running == 0:
        return max(0.0, REFILL_DELAY - since_active)
    if running < cores and stalled <= stall_limit:
        return max(0.0, SETTLE - since_request)
    return None


def cpu_stall_us(path: str = "/proc/pressure/cpu") -> int | None:
    """Microseconds some task has waited for a CPU since boot (Linux PSI), or None
    where the kernel does not say."""
    try:
        with open(path) as f:
            some = f.readline().split()
    except OSError:
        return None
    totals = [field[6:] for field in some if field.startswith("total=")]
    return int(totals[0]) if some[:1] == ["some"] and totals and totals[0].isdigit() else None


@dataclass
class _Keeper:
    """A keeper the forkserver has forked: its end of the keeper's link."""

    link: socket.socket
    warm: bool = False
    """Free and holding an idle worker (told to fork one)."""
    generation: int = 0
    """The pool's ``generation`` when it was forked."""


class Pool:
    """The forkserver's keepers and idle workers (see module contract)."""

    def __init__(self, selector: selectors.BaseSelector) -> None:
        self.size = 0  # warm keepers to keep: the last launch's, 0 until the first
        self.idle_timeout = 0.0
        self.free: dict[int, _Keeper] = {}  # pid -> keeper, oldest first
        self.busy: dict[int, _Keeper] = {}  # pid -> keeper of a running rank
        self.ending: set[int] = set()  # pids told to end (or that died), not yet reaped
        self.last_used = time.monotonic()  # the last request or rank exit
        self.last_request = self.last_used
        self._selector = selector  # every link is in it, with its keeper's pid as data
        self.generation = 0  # keepers of an older one are not kept (``renew``)

    def fds(self) -> set[int]:
        """The forkserver's ends of the keepers' links: every child it forks must close
        them, or a keeper would never see EOF when the forkserver ends it."""
        return {k.link.fileno() for k in (*self.free.values(), *self.busy.values())}

    def warm(self) -> int:
        """Free keepers holding an idle worker."""
        return sum(k.warm for k in self.free.values())

    def resize(self, size: int, idle_timeout: float) -> None:
        """A launch asked for ``size`` idle workers from now on; end free keepers beyond that."""
        self.size, self.idle_timeout = size, idle_timeout
        self.last_used = self.last_request = time.monotonic()
        while len(self.free) > size:
            cold = [pid for pid, k in self.free.items() if not k.warm]
            self._end((cold or list(self.free))[-1])  # the youngest, cold first: others are warmer

    def touch(self) -> None:
        """Something ran (a rank exited): the idle clock starts again."""
        self.last_used = time.monotonic()

    def hand_over(self, fds: Sequence[int]) -> int | None:
        """Give a rank's fds (ctrl, out, err, status) to a free keeper, warm first; its
        pid, or None if none is free. The caller keeps its own copies of ``fds``."""
        while self.free:
            pid = next((p for p, k in self.free.items() if k.warm), next(iter(self.free)))
            keeper = self.free.pop(pid)
            try:
                socket.send_fds(keeper.link, [pooled.RUN], list(fds))
            except OSError:  # it died while free (the reaper will collect it)
                self._drop(pid, keeper)
                continue
            keeper.warm = False
            self.busy[pid] = keeper
            return pid
        return None

    def start_keeper(self, close: set[int], fds: Sequence[int] | None) -> int:
        """Fork a keeper: busy with the rank on ``fds`` (ctrl, out, err, status), or with
        None, free and told to warm up. ``close``: the forkserver's fds, which it must
        not keep. Its pid."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        forkserver = os.getpid()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the keeper
            try:
                detach({*close, *self.fds()})
                ours.close()
            except BaseException:
                traceback.print_exc()
                os._exit(1)
            pooled.serve(theirs, forkserver, None if fds is None else list(fds), fds is None)
        theirs.close()
        keeper = _Keeper(ours, warm=fds is None, generation=self.generation)
        (self.busy if fds is not None else self.free)[pid] = keeper
        self._selector.register(ours, selectors.EVENT_READ, pid)
        return pid

    def short(self) -> bool:
        """Fewer warm keepers than the last launch asked for."""
        return self.warm() < self.size

    def warm_one(self, close: set[int]) -> None:
        """Make one more keeper warm: a cold free one forks its idle worker, or else a new
        warm keeper is forked; ``close``: as for ``start_keeper``."""
        cold = next((pid for pid, k in self.free.items() if not k.warm), None)
        if cold is None:
            self.start_keeper(close, None)
            return
        keeper = self.free[cold]
        try:
            keeper.link.sendall(pooled.WARM)
        except OSError:  # it died while free (the reaper will collect it)
            self._drop(cold, self.free.pop(cold))
            return
        keeper.warm = True

    def heard(self, pid: int, listening: bool) -> None:
        """A keeper's link is readable: it is free again (``pooled.FREE``), kept if
        ``listening`` and fewer than ``size`` are free, else ended; or it closed (the
        keeper died: the reaper collects it)."""
        keeper = self.busy.get(pid) or self.free.get(pid)
        if keeper is None:
            return
        try:
            said = keeper.link.recv(1)
        except OSError:
            said = b""
        if said != pooled.FREE or pid not in self.busy:
            self.busy.pop(pid, None)
            self.free.pop(pid, None)
            self._drop(pid, keeper)
            return
        self.touch()
        self.free[pid] = self.busy.pop(pid)
        if not listening or len(self.free) > self.size or keeper.generation != self.generation:
            self._end(pid)

    def renew(self) -> None:
        """The forkserver's memory has changed under its keepers (moved into huge pages,
        ``hugepages``), and those forked before no longer share it: end the free ones
        now and the busy ones once their rank has ended, so that keepers forked from
        the memory as it is now take their place (a refill, or the next request)."""
        self.generation += 1
        for pid in list(self.free):
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
        """A child exited (reaped by the forkserver): True if it was one of the keepers."""
        if pid in self.ending:
            self.ending.discard(pid)
            return True
        keeper = self.free.pop(pid, None)
        if keeper is not None:
            # It died while free (killed from outside, or it failed): not replaced
            # until the next launch, so a worker that cannot start is not forked in a loop.
            self._close(keeper)
            self.size = min(self.size, self.warm())
            return True
        keeper = self.busy.pop(pid, None)
        if keeper is None:
            return False
        self._close(keeper)  # it died keeping a rank (killed): the rank's link tells the notebook
        self.touch()
        return True

    def _end(self, pid: int) -> None:
        self._close(self.free.pop(pid))
        # Why SIGKILL as well as EOF: a free keeper holds no job and no user
        # state, and the forkserver waits for it before exiting, so it must not be
        # able to linger. It is not reaped yet, so the pid is still this child.
        os.kill(pid, signal.SIGKILL)
        self.ending.add(pid)

    def _drop(self, pid: int, keeper: _Keeper) -> None:
        """A keeper whose link failed or said something else than ``FREE``: it died, or
        is not to be trusted; ended (it is not reaped yet, so the pid is still ours)."""
        self._close(keeper)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        self.ending.add(pid)

    def _close(self, keeper: _Keeper) -> None:
        self._selector.unregister(keeper.link)
        keeper.link.close()
