"""A forkserver's keeper, reused from rank to rank, and its idle worker.

Contract: ``serve(link, forkserver, first)`` is the body of a keeper that the
forkserver forked (``launcher.pool.Pool``) and that has already detached (its own
session, the forkserver's fds closed, default signals). It is the parent of
one rank at a time, as ``keeper.keep`` is of its one rank, and takes the
forkserver's orders on ``link``, one at a time:

- ``b"R"`` with four fds (ctrl, out, err, status_w): start a rank on them (hand
  them to its idle worker if it holds one, else fork the rank), write the rank's
  pid to ``status_w``, and once the rank and every descendant are gone, its exit
  code (``keeper.supervise``); then say ``b"F"`` (free) on ``link``;
- ``b"W"``: fork an idle worker, which warms up and waits (if it holds none);
- EOF: exit; its idle worker, if any, dies with it.

``first``: the fds of a rank to start before reading any order (a keeper forked
for a request that found none free); ``warm``: fork an idle worker first (a
keeper forked to refill the pool). The keeper and its idle worker are named
``nbddp-idle`` while free (the worker only once warmed up: ``nbddp-warming``
before), the keeper ``nbddp-keeper`` while it keeps a rank.

Lifetime: while free, the keeper dies with the forkserver (``PR_SET_PDEATHSIG``,
then a check of its parent, for a forkserver that died before that took
effect); while it keeps a rank it does not, since a rank outlives its
forkserver, and a keeper that finds its forkserver gone after the rank exits.

Why reuse a keeper: every process here is a copy of the forkserver's address
space (torch's hundreds of MB), whose fork and exit each cost milliseconds of
page-table work (about 8 ms per fork on a 2-core VM). A reused keeper saves its
own fork and exit for every rank, and the keepers of a launch fork its ranks
side by side instead of one after another in the forkserver's single loop.
Nothing passes from one rank to the next through it: the keeper runs no user
code and receives only fds and orders, and each rank or idle worker is a fresh
fork of it.

CUDA: an idle worker runs only nbddp's code and ``_warm_up``, neither of which
initialises CUDA; the rank's environment (``CUDA_VISIBLE_DEVICES`` and the
rest) is applied by ``worker.serve`` when the order arrives, before any user
code runs, exactly as in a rank forked on demand.
"""

from __future__ import annotations

import ctypes
import gc
import os
import signal
import socket
import traceback
from dataclasses import dataclass
from datetime import timedelta
from typing import NoReturn

from nbddp.rank import keeper, worker

IDLE_NAME = "nbddp-idle"
WARMING_NAME = "nbddp-warming"
"""An idle worker's name until it is ready: ``IDLE_NAME`` says "ready and waiting"."""
PR_SET_PDEATHSIG = 1
RUN = b"R"
WARM = b"W"
FREE = b"F"
RANK_FDS = 4
"""ctrl, out, err and status_w: the fds that come with ``RUN``."""


@dataclass(frozen=True)
class _Idle:
    """An idle worker this keeper forked: its pid and the keeper's end of its link."""

    pid: int
    link: socket.socket


def serve(
    link: socket.socket, forkserver: int, first: list[int] | None = None, warm: bool = False
) -> NoReturn:
    """The keeper's life (see module contract); never returns."""
    try:
        keeper.become_subreaper()
        idle = _fork_idle(link) if warm else None
        fds = first
        while True:
            if fds is None:
                _free(forkserver)
                order, fds = _next_order(link)
                if order == WARM:
                    idle = idle or _fork_idle(link)
                    fds = None
                    continue
                if order != RUN or fds is None:
                    break  # the forkserver ended it (EOF), or a malformed order
            _prctl_pdeathsig(0)  # the rank outlives the forkserver, and so does its keeper
            rank = _start_rank(idle, link, fds)
            idle = None
            keeper.supervise(rank, fds[3])
            fds = None
            if not _say_free(link):
                break
    except BaseException:
        traceback.print_exc()
        os._exit(1)
    os._exit(0)


def _free(forkserver: int) -> None:
    """Between ranks: named idle, and dying with the forkserver."""
    worker.set_process_name(IDLE_NAME)
    _die_with(forkserver)


def _next_order(link: socket.socket) -> tuple[bytes, list[int] | None]:
    """The next order and its fds (None unless exactly a rank's); (b"", None) at EOF."""
    try:
        msg, fds, _, _ = socket.recv_fds(link, 1, RANK_FDS)
    except OSError:
        return b"", None
    if len(fds) == RANK_FDS:
        return msg, list(fds)
    for fd in fds:
        os.close(fd)
    return msg, None


def _say_free(link: socket.socket) -> bool:
    """Tell the forkserver this keeper is free; False if it is gone."""
    try:
        link.sendall(FREE)
    except OSError:
        return False
    return True


def _start_rank(idle: _Idle | None, link: socket.socket, fds: list[int]) -> int:
    """Start the rank on ``fds`` (ctrl, out, err, status_w): the idle worker takes them,
    or, with none (or one that died while idle), a rank is forked now. Its pid; the
    rank's three fds are closed here, ``status_w`` is kept for ``supervise``."""
    ctrl, out, err, status_w = fds
    rank: int | None = None
    if idle is not None:
        try:
            socket.send_fds(idle.link, [RUN], [ctrl, out, err])
            rank = idle.pid
        except OSError:  # it died while idle: reap it, and fork the rank as on demand
            os.waitpid(idle.pid, 0)
        finally:
            idle.link.close()
    if rank is None:
        rank = os.fork()
        if rank == 0:  # pragma: no cover - runs in the rank
            try:
                worker.set_process_name("nbddp-worker")  # not its free keeper's name
                link.close()
                os.close(status_w)
                os.setsid()
            except BaseException:
                traceback.print_exc()
                os._exit(1)
            worker.run_forked(ctrl, out, err)
    for fd in (ctrl, out, err):
        os.close(fd)
    return rank


def _fork_idle(link: socket.socket) -> _Idle:
    """Fork an idle worker, which warms up and waits for a rank's fds."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    me = os.getpid()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the idle worker
        worker.set_process_name(WARMING_NAME)  # not its free keeper's: it is not ready yet
        link.close()
        ours.close()
        os.setsid()
        _idle_worker(theirs, me)
    theirs.close()
    return _Idle(pid, ours)


def _idle_worker(link: socket.socket, keeper_pid: int) -> NoReturn:
    """The body of an idle worker: get ready, wait for one rank's fds, run it."""
    try:
        _die_with(keeper_pid)
        try:
            _warm_up()
        except Exception:  # only ever a head start: the rank does the same work itself
            traceback.print_exc()
        gc.freeze()  # what the warm-up made too: see launcher.forkserver.main
        # Named only now, so that the name says "ready and waiting" (tests wait on it).
        worker.set_process_name(IDLE_NAME)
        fds = _wait_for_fds(link, 3)
    except BaseException:
        traceback.print_exc()
        os._exit(1)
    if fds is None:
        os._exit(0)
    # A rank's life is tied to its link to the notebook, as for a rank forked
    # on demand; its keeper going away must not kill a run in progress.
    _prctl_pdeathsig(0)
    worker.run_forked(*fds)


def _prctl_pdeathsig(sig: int) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the link's EOF still ends an idle process


def _die_with(parent: int) -> None:
    _prctl_pdeathsig(signal.SIGKILL)
    if os.getppid() != parent:  # it died before the line above took effect
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
