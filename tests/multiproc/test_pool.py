"""The forkserver's pool of idle workers: one-shot, sized to the last launch, winding
down when idle, never outliving the forkserver, and off when asked.

Every test here gets the leftover-process check (tests/conftest.py), which
also fails on idle workers that are not a live forkserver's. Waits are on
conditions with deadlines (``tests.procs.wait_pool``), never on sleeps.
"""

from __future__ import annotations

import os
import signal

import psutil
import pytest

import nbddp
from nbddp.launcher.forkserver_link import FORKSERVER
from tests.multiproc import fns
from tests.procs import fd_identities, rank_and_keeper_pipes, wait_pool, wait_procs_gone


def forkserver_with_pool(size: int, **launch: object) -> tuple[int, list[psutil.Process]]:
    """Launch ``size`` ranks once, then wait for the refilled pool: (forkserver pid, idle)."""
    assert nbddp.launch(fns.all_reduce_sum, 0.0, procs=size, output="none", **launch)
    forkserver = FORKSERVER.pid
    assert forkserver is not None
    return forkserver, wait_pool(forkserver, size)


def _procs(pids: set[int]) -> list[psutil.Process]:
    found = []
    for pid in pids:
        try:
            found.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    return found


def test_a_run_leaves_nothing_for_the_next_which_runs_in_fresh_pool_workers() -> None:
    first = nbddp.launch(fns.leave_state, procs=2, block=False, output="none")
    first_ranks = {pids[0] for pids in first.wait().values.values()}
    first_keepers = {pids[1] for pids in first.wait().values.values()}
    # One-shot: the first run's ranks are gone, none kept for another run.
    assert wait_procs_gone(_procs(first_ranks), timeout=5) == []
    forkserver = FORKSERVER.pid
    assert forkserver is not None
    workers = wait_pool(forkserver, 2)
    idle = {p.pid for p in workers}
    # The keepers stay, free, and each forked a fresh idle worker.
    assert {p.ppid() for p in workers} == first_keepers

    second = nbddp.launch(fns.find_state, procs=2, block=False, output="none").wait()

    seen = second.values
    assert {s["pid"] for s in seen.values()} == idle  # the pool served it...
    assert not idle & first_ranks  # ...with processes that had run nothing
    for state in seen.values():
        assert state["global"] is None and state["env"] is None
        assert not state["module"] and not state["group"]
        assert state["cuda_initialized"] is False


def test_back_to_back_launches_reuse_the_keepers_and_each_rank_is_a_fresh_process() -> None:
    """A launch right after another (a sweep's loop) finds the keepers free but not
    warm: each forks its rank now, side by side, and the rank has none of the last
    one's state."""
    first = nbddp.launch(fns.leave_state, procs=2, output="none", block=False).wait()
    second = nbddp.launch(fns.leave_state, procs=2, output="none", block=False).wait()
    third = nbddp.launch(fns.find_state, procs=2, output="none", block=False).wait()
    keepers = [{pids[1] for pids in run.values.values()} for run in (first, second)]
    ranks = [{pids[0] for pids in run.values.values()} for run in (first, second)]
    assert keepers[0] == keepers[1]  # the same two keepers kept both runs' ranks
    assert not ranks[0] & ranks[1]
    for state in third.values.values():
        assert state["pid"] not in ranks[0] | ranks[1]
        assert state["global"] is None and state["env"] is None
        assert not state["module"] and not state["group"]


def test_the_pool_refills_to_the_last_launch_size_capped_by_nbddp_pool(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = nbddp.launch(rank_and_keeper_pipes, procs=3, block=False, output="none").wait()
    finished = {tuple(ident) for idents in run.values.values() for ident in idents}
    forkserver = FORKSERVER.pid
    assert forkserver is not None
    idle = wait_pool(forkserver, 3)
    for proc in idle:
        assert proc.num_fds() == 4, proc.open_files()  # its stdio and its link to its keeper
    pool = [*idle, *(proc.parent() for proc in idle)]  # the idle workers and their keepers
    held = {proc.pid: fd_identities(proc.pid) for proc in pool}
    others = {forkserver: fd_identities(forkserver)}
    stdio = [others[forkserver][fd] for fd in (0, 1, 2)]
    for pid, fds in held.items():
        # Each holds the forkserver's stdio, and its own link ends that no other
        # process holds: no pipe of the finished run, no other idle worker's link.
        assert [fds[fd] for fd in (0, 1, 2)] == stdio
        assert not set(fds.values()) & finished, (pid, fds)
        elsewhere = {i for p, f in {**held, **others}.items() if p != pid for i in f.values()}
        assert not {i for fd, i in fds.items() if fd > 2} & elsewhere, (pid, fds)
    assert nbddp.launch(fns.all_reduce_sum, 0.0, procs=1, output="none") == 0.0
    assert len(wait_pool(forkserver, 1)) == 1
    monkeypatch.setenv("NBDDP_POOL", "1")
    assert nbddp.launch(fns.all_reduce_sum, 0.0, procs=2, output="none") == 1.0
    assert len(wait_pool(forkserver, 1)) == 1


def test_idle_workers_end_after_the_idle_timeout_and_the_next_launch_refills(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NBDDP_POOL_IDLE", "2")
    forkserver, idle = forkserver_with_pool(2)
    assert wait_pool(forkserver, 0, timeout=15) == []
    assert wait_procs_gone(idle, timeout=5) == []
    assert nbddp.launch(fns.all_reduce_sum, 0.0, procs=2, output="none") == 1.0
    assert len(wait_pool(forkserver, 2)) == 2


def test_nbddp_pool_0_ends_idle_workers_and_forks_each_rank_on_demand(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    forkserver, idle = forkserver_with_pool(2)
    monkeypatch.setenv("NBDDP_POOL", "0")
    run = nbddp.launch(fns.find_state, procs=2, block=False, output="none")
    pids = {s["pid"] for s in run.wait().values.values()}
    assert not pids & {p.pid for p in idle}
    assert wait_pool(forkserver, 0) == []
    assert wait_procs_gone(idle, timeout=5) == []


@pytest.mark.parametrize(("how", "code"), [("os._exit", 9), ("sigkill", -9)])
def test_a_pool_workers_exit_code_reaches_the_notebook(how: str, code: int) -> None:
    _, idle = forkserver_with_pool(2)
    run = nbddp.launch(fns.fail_on, 1, how, procs=2, output="none", block=False)
    with pytest.raises(nbddp.RankExitedError) as info:
        run.wait()
    assert set(run.pids.values()) == {p.pid for p in idle}
    assert info.value.exit_code == code and info.value.rank == 1


def test_idle_workers_end_with_the_forkserver() -> None:
    forkserver, idle = forkserver_with_pool(2)
    procs = [psutil.Process(forkserver), *idle]
    nbddp.shutdown()  # the notebook closes the forkserver's link
    assert wait_procs_gone(procs, timeout=10) == []


def test_idle_workers_die_when_the_forkserver_is_killed() -> None:
    forkserver, idle = forkserver_with_pool(2)
    os.kill(forkserver, signal.SIGKILL)
    assert wait_procs_gone(idle, timeout=10) == []
    assert nbddp.launch(fns.all_reduce_sum, 0.0, procs=2, output="none") == 1.0  # a new one
