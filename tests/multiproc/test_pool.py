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
from nbddp.launcher.starters import FORKSERVER
from tests.multiproc import fns
from tests.procs import wait_pool, wait_procs_gone


def forkserver_with_pool(size: int, **launch: object) -> tuple[int, list[psutil.Process]]:
    """Launch ``size`` ranks once, then wait for the refilled pool: (forkserver pid, idle)."""
    assert nbddp.launch(fns.all_reduce_sum, 0.0, procs=size, output="none", **launch)
    forkserver = FORKSERVER.pid
    assert forkserver is not None
    return forkserver, wait_pool(forkserver, size)


def test_a_run_leaves_nothing_for_the_next_which_runs_in_fresh_pool_workers() -> None:
    first = nbddp.launch(fns.leave_state, procs=2, block=False, output="none")
    first_pids = set(first.wait().values.values())
    forkserver = FORKSERVER.pid
    assert forkserver is not None
    idle = {p.pid for p in wait_pool(forkserver, 2)}

    second = nbddp.launch(fns.find_state, procs=2, block=False, output="none").wait()

    seen = second.values
    assert {s["pid"] for s in seen.values()} == idle  # the pool served it...
    assert not idle & first_pids  # ...with processes that had run nothing
    for state in seen.values():
        assert state["global"] is None and state["env"] is None
        assert not state["module"] and not state["group"]
        assert state["cuda_initialized"] is False
    assert first_pids.isdisjoint(p.pid for p in psutil.Process(forkserver).children())


def test_the_pool_refills_to_the_last_launch_size_capped_by_nbddp_pool(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    forkserver, idle = forkserver_with_pool(3)
    for proc in idle:
        # Its stdio and its link to the forkserver: no pipe of a run, no other worker's link.
        assert proc.num_fds() == 4, proc.open_files()
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
