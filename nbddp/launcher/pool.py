"""The forkserver's pool of idle one-shot workers: how a warm launch beats a plain fork.

Contract: a ``Pool`` lives in the forkserver (single-threaded, like the forkserver)
and owns the idle children. Each is a pair forked ahead of time: a keeper
(``nbddp.rank.keeper``), the forkserver's child, blocked on a private
socketpair to the forkserver, and under it the idle worker, which has
already done what a forked rank does first (its own session, the
forkserver's fds closed, default signals), warmed up, and blocks on a
socketpair to its keeper; both are named ``nbddp-idle``. ``hand_over``
sends the fds of one rank (ctrl, out, err, status) to the oldest idle
keeper and returns its pid; the keeper passes the first three to its
worker and keeps the status fd: from then on the pair is exactly a keeper
and its rank forked on demand (``starters.run_kept_worker``) and no longer
the pool's; the rank runs one order and exits. A worker never runs two jobs, so no state (module
globals, environment, ``sys.modules``, a process group) passes from one
run to the next.

Sizing is the forkserver's call (``resize`` on each request, ``spawn_one``
when a refill is due, ``wind_down`` after ``idle_timeout`` seconds without
a launch); when a refill is due is ``refill_wait``'s (a pure function):
during a run only where the machine has a core its ranks leave spare, and
otherwise once no rank has run for a moment. A refill never forks more than
the last launch's size: at most what one more launch needs.

An idle child exits on its own when its link closes (the forkserver ended it,
exited, or died) and the kernel kills it if the forkserver dies first
(``PR_SET_PDEATHSIG``), as it kills the worker if its keeper dies: idle
workers never outlive the forkserver.

CUDA: an idle child runs only nbddp's code and ``_warm_up``, neither of
which initialises CUDA; the rank's environment (``CUDA_VISIBLE_DEVICES``
and the rest) is applied by ``worker.serve`` when the order arrives,
before any user code runs, exactly as in a rank forked on demand.
"""

from __future__ import annotations

import ctypes
import gc
import os
import signal
import socket
import time
import traceback
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import NoReturn

from nbddp.launcher.starters import ChildFds, detach, run_detached_worker
from nbddp.rank import keeper
from nbddp.rank.worker import set_process_name

IDLE_NAME = "nbddp-idle"
PR_SET_PDEATHSIG = 1
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

    A refill costs CPU: a fork of the forkserver (milliseconds: the page tables
    of a process with torch imported), the keeper's fork of its worker, and the
    worker's warm-up. Where a core is spare (``running < cores``: a GPU machine
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


class Pool:
    """The idle workers of one forkserver (see module contract)."""

    def __init__(self) -> None:
        self.size = 0  # idle workers to keep: the last launch's, 0 until the first
        self.idle_timeout = 0.0
        self.idle: dict[
            int, socket.socket
        ] = {}  # pid -> forkserver's end of its link, oldest first
        self.ending: set[int] = set()  # pids told to end, not yet reaped
        self.last_used = time.monotonic()  # the last request or rank exit
        self.last_request = self.last_used

    def fds(self) -> set[int]:
        """The forkserver's ends of the idle links: every child it forks must close them,
        or an idle worker would never see EOF when the forkserver ends it."""
        return {link.fileno() for link in self.idle.values()}

    def resize(self, size: int, idle_timeout: float) -> None:
        """A launch asked for ``size`` idle workers from now on; end any beyond that."""
        self.size, self.idle_timeout = size, idle_timeout
        self.last_used = self.last_request = time.monotonic()
        while len(self.idle) > size:
            self._end(next(reversed(self.idle)))  # the youngest: the others are warmer

    def touch(self) -> None:
        """Something ran (a rank exited): the idle clock starts again."""
        self.last_used = time.monotonic()

    def hand_over(self, fds: Sequence[int]) -> int | None:
        """Give a rank's fds (ctrl, out, err, status) to an idle keeper; its pid, or None
        if none is left. The caller keeps its own copies of ``fds``."""
        while self.idle:
            pid = next(iter(self.idle))
            link = self.idle.pop(pid)
            try:
                socket.send_fds(link, [b"R"], list(fds))
            except OSError:  # it died while idle (the reaper will collect it)
                self.ending.add(pid)
                continue
            finally:
                link.close()
            return pid
        return None

    def short(self) -> bool:
        """Fewer idle workers than the last launch asked for."""
        return len(self.idle) < self.size

    def spawn_one(self, close: set[int]) -> None:
        """Fork one idle worker; ``close``: the forkserver's fds, which it must not keep."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        forkserver = os.getpid()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            _idle_main(theirs, {*close, *self.fds(), ours.fileno()}, forkserver)
        theirs.close()
        self.idle[pid] = ours

    def wind_down_in(self) -> float | None:
        """Seconds until idle workers end for want of launches; None when none is idle."""
        if not self.idle:
            return None
        return max(0.0, self.last_used + self.idle_timeout - time.monotonic())

    def wind_down(self) -> None:
        """End every idle worker and keep none until the next launch says how many."""
        self.size = 0
        for pid in list(self.idle):
            self._end(pid)

    def forget(self, pid: int) -> bool:
        """A child exited (reaped by the forkserver): True if it was one of the pool's."""
        if pid in self.ending:
            self.ending.discard(pid)
            return True
        link = self.idle.pop(pid, None)
        if link is None:
            return False
        # It died while idle (killed from outside, or it failed): not replaced
        # until the next launch, so a worker that cannot start is not forked in a loop.
        link.close()
        self.size = min(self.size, len(self.idle))
        return True

    def _end(self, pid: int) -> None:
        self.idle.pop(pid).close()
        # Why SIGKILL as well as EOF: an idle worker holds no job and no user
        # state, and the forkserver waits for it before exiting, so it must not be
        # able to linger. It is not reaped yet, so the pid is still this child.
        os.kill(pid, signal.SIGKILL)
        self.ending.add(pid)


def _idle_main(link: socket.socket, close: set[int], forkserver: int) -> NoReturn:
    """The body of an idle keeper: fork the idle worker, wait for one rank's fds, keep it."""
    try:
        detach(close)
        _die_with(forkserver)
        keeper.become_subreaper()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        me = os.getpid()
        worker = os.fork()
        if worker == 0:  # pragma: no cover - runs in the idle worker
            link.close()
            ours.close()
            os.setsid()
            _idle_worker(theirs, me)
        theirs.close()
        set_process_name(IDLE_NAME)
        fds = _wait_for_fds(link, 4)
        if fds is None:
            os._exit(0)
        _prctl_pdeathsig(0)  # the rank outlives the forkserver, and so does its keeper
        _start_rank(ours, worker, fds)
    except BaseException:
        traceback.print_exc()
    os._exit(1)


def _start_rank(link: socket.socket, worker: int, fds: list[int]) -> NoReturn:
    """Pass the rank's fds to the idle worker and keep it; if it died while idle,
    fork the rank afresh."""
    ctrl, out, err, status_w = fds
    try:
        socket.send_fds(link, [b"R"], [ctrl, out, err])
    except OSError:  # it died while idle: reap it, and fork the rank as on demand
        link.close()
        os.waitpid(worker, 0)
        keeper.keep(lambda: run_detached_worker(ChildFds(ctrl, out, err)), status_w, fds[:3])
    link.close()
    for fd in fds[:3]:
        os.close(fd)
    keeper.supervise(worker, status_w)
    os._exit(0)


def _idle_worker(link: socket.socket, keeper_pid: int) -> NoReturn:
    """The body of an idle worker: get ready, wait for one rank's fds, run it."""
    try:
        _die_with(keeper_pid)
        try:
            _warm_up()
        except Exception:  # only ever a head start: the rank does the same work itself
            traceback.print_exc()
        gc.freeze()  # what the warm-up made too: see forkserver.main
        # Named only now, so that the name says "ready and waiting" (tests wait on it).
        set_process_name(IDLE_NAME)
        fds = _wait_for_fds(link, 3)
    except BaseException:
        traceback.print_exc()
        os._exit(1)
    if fds is None:
        os._exit(0)
    # A rank's life is tied to its link to the notebook, as for a rank forked
    # on demand; its keeper going away must not kill a run in progress.
    _prctl_pdeathsig(0)
    run_detached_worker(ChildFds(*fds))


def _prctl_pdeathsig(sig: int) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the link's EOF still ends an idle worker


def _die_with(forkserver: int) -> None:
    _prctl_pdeathsig(signal.SIGKILL)
    if os.getppid() != forkserver:  # it died before the line above took effect
        os._exit(0)


def _warm_up() -> None:
    """Run, while idle, the code paths a rank runs after its launch, so that the
    pages they write are already this process's own (fork shares the forkserver's
    pages copy-on-write; each first write costs a fault and a copy).

    Measured on the launch benchmark's rank (2 CPU ranks, gloo): about 1,000
    page faults from waking to the end of an all_reduce without this, 600
    with it, and the rank's part of the launch a few ms shorter; it adds
    under 2 MB to each idle worker. Nothing here initialises CUDA: a one-rank
    gloo group over an in-process store on CPU tensors, destroyed again (it
    leaves no thread behind), so the rank's own group is its only one.
    """
    import pickle

    import torch
    import torch.distributed as dist

    from nbddp.wire.payload import Payload, load_call
    from nbddp.wire.protocol import Placement, RunOrder, encode

    fn = Payload.serialize(_warm_up, (), {}).data
    order = RunOrder(
        place=Placement(rank=0, local_rank=0, world_size=1, local_world_size=1, device="cpu"),
        env=dict(os.environ),
        payload=fn,
        sys_path=[],
        cwd="/",
        backend="gloo",
        init_process_group=False,
        threads=1,
    )
    pickle.loads(encode("run", order)[8:])  # the worker's protocol.recv, minus the socket
    load_call(fn)
    if dist.is_available():
        store = dist.HashStore()  # type: ignore[attr-defined]  # exported at runtime
        group = dist.ProcessGroupGloo(store, 0, 1, timedelta(seconds=10))
        group.allreduce([torch.ones(1)]).wait()  # type: ignore[attr-defined]  # not in stubs
        del group, store


def _wait_for_fds(link: socket.socket, count: int) -> list[int] | None:
    """Block until ``count`` fds arrive on ``link``; None if it closes instead."""
    try:
        _, fds, _, _ = socket.recv_fds(link, 1, count)
    except OSError:
        return None
    finally:
        link.close()
    if len(fds) != count:
        for fd in fds:
            os.close(fd)
        return None
    return list(fds)
