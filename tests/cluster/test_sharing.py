"""Sharing a cluster: runs at once on the same agents, each its own; idle agents handed
back after ``NBDDP_CLUSTER_IDLE`` or when another driver waits for their resources."""

from __future__ import annotations

import time
from pathlib import Path

import psutil
import pytest

import nbddp
from nbddp.cluster import agents as nodes
from tests.cluster.conftest import newest
from tests.cluster.notebook import exit_while_looking, results_through
from tests.cluster.ranks import env_of_rank, sleep_in_a_named_function, wait_for
from tests.procs import wait_procs_gone


def test_two_background_runs_each_complete_on_their_own(cluster: object, tmp_path: Path) -> None:
    address = cluster.address  # type: ignore[attr-defined]
    gates = tmp_path / "one", tmp_path / "two"
    one = nbddp.launch(
        wait_for, str(gates[0]), "one", nodes=2, procs=1, cluster=address, block=False
    )
    two = nbddp.launch(
        wait_for, str(gates[1]), "two", nodes=2, procs=1, cluster=address, block=False
    )
    assert newest().in_use() and len(newest().runs) == 2  # the same agents, two jobs each
    gates[1].touch()
    assert two.wait().values == {0: "two", 1: "two"}
    assert not one.ended(), one.status  # the first run goes on, unaffected
    gates[0].touch()
    assert one.wait().values == {0: "one", 1: "one"}


def test_two_background_runs_each_time_out_on_their_own(cluster: object) -> None:
    address = cluster.address  # type: ignore[attr-defined]
    short = nbddp.launch(
        sleep_in_a_named_function, nodes=2, procs=1, cluster=address, timeout=2, block=False
    )
    long = nbddp.launch(
        sleep_in_a_named_function, nodes=2, procs=1, cluster=address, timeout=20, block=False
    )
    with pytest.raises(nbddp.LaunchTimeout, match="timeout of 2s"):
        short.wait()
    assert long.status == "running"
    with pytest.raises(nbddp.LaunchTimeout, match="timeout of 20s"):
        long.wait()
    for run in (short, long):
        assert "stuck_here_for_a_while" in run.output(1), run.output(1)


def test_idle_agents_are_handed_back_after_the_idle_setting(
    cluster: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NBDDP_CLUSTER_IDLE", "1")
    nbddp.launch(env_of_rank, nodes=2, procs=1, cluster=cluster.address)  # type: ignore[attr-defined]
    agents = [psutil.Process(info.pid) for info in newest().infos]
    assert "idle, handed back in" in nbddp.cluster.describe()
    assert not wait_procs_gone(agents, timeout=30), "idle agents still held"
    assert nodes.kept() == []
    assert nbddp.cluster.describe() == "no agents held on any cluster"


@pytest.mark.timeout(300)  # the other driver starts agents and forkservers afresh: on a
# loaded machine that is a minute or more
def test_a_second_driver_launches_while_this_one_holds_idle_agents(cluster: object) -> None:
    # This process holds the only CPU of each node (idle agents, kept for 300 s).
    address = cluster.address  # type: ignore[attr-defined]
    nbddp.launch(env_of_rank, nodes=2, procs=1, cluster=address)
    held = [psutil.Process(info.pid) for info in newest().infos]
    started = time.monotonic()
    out = results_through(address)  # another notebook: a run, then a failing run
    took = time.monotonic() - started
    assert "ENV 0 4 0\n" in out
    assert not wait_procs_gone(held, timeout=10), "the idle agents were not handed back"
    assert nodes.kept() == []
    print(f"the other driver's two runs took {took:.1f}s while this one held idle agents")


def test_a_notebook_exits_cleanly_while_its_keeper_looks_at_the_cluster(cluster: object) -> None:
    # The engine shuts down with the process; a look at it in flight ends first.
    done = exit_while_looking(cluster.address)  # type: ignore[attr-defined]
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr[-2000:]}"
    # A look that began before the exit ended before the engine shut down; none began after.
    assert done.stdout.startswith("ENV 0\n") and "after shutdown" not in done.stdout, done.stdout
