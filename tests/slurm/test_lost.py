"""What only Slurm can end: a job's time limit, and a node whose slurmd is gone (Slurm
declares it lost after ``SlurmdTimeout`` plus a ping, 43-48 s on the test cluster): the
run ends within seconds of Slurm saying so, naming why."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

import pytest

import nbddp
from nbddp.errors import ConfigError, RankExitedError
from nbddp.launcher.events import RankState
from tests.slurm.conftest import LAB, SCRIPT, other_jobs, slurm


def running(run: nbddp.Run) -> None:
    deadline = time.monotonic() + 60
    while set(run.rank_states().values()) != {RankState.RUNNING}:
        assert time.monotonic() < deadline, run.rank_states()
        time.sleep(0.05)


@pytest.mark.timeout(240)
def test_the_time_limit_ends_the_run_saying_so(
    in_allocation: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SLURM_JOB_ID")  # an allocation of its own, of one minute
    run = nbddp.launch(time.sleep, 600, nodes=2, procs=1, cluster="slurm --time 1", block=False)
    running(run)
    (job,) = other_jobs(in_allocation)
    with pytest.raises(RankExitedError, match=f"\\(Slurm job {job} reached its time limit\\)"):
        run.wait(timeout=200)


def lose_n2() -> None:
    os.kill(int((LAB / "run" / "slurmd-n2.pid").read_text()), signal.SIGKILL)


def bring_n2_back() -> None:
    """The node comes back to serve the next tests, and the allocation with it."""
    nbddp.cluster.release()
    subprocess.run(["bash", str(SCRIPT), "start"], check=True, timeout=120)
    deadline = time.monotonic() + 60
    while "n2 idle" not in slurm("sinfo", "-h", "-N", "-o", "%N %t") and (
        "n2 mix" not in slurm("sinfo", "-h", "-N", "-o", "%N %t")
    ):
        assert time.monotonic() < deadline, slurm("sinfo", "-N")
        time.sleep(0.2)


@pytest.mark.timeout(240)
def test_a_node_slurm_loses_ends_the_run_naming_it(in_allocation: str) -> None:
    run = nbddp.launch(time.sleep, 600, nodes=2, procs=1, cluster="slurm", block=False)
    running(run)
    lose_n2()
    try:
        with pytest.raises(RankExitedError, match=r"loss of node 1 .*Node failure on n2"):
            run.wait(timeout=200)
    finally:
        bring_n2_back()


@pytest.mark.timeout(240)
def test_a_restart_after_slurm_lost_a_node_says_at_once_that_it_is_gone(
    in_allocation: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nbddp.cluster import slurm_engine

    # Longer than the test may take: it passes only if placement did not wait this out.
    monkeypatch.setattr(slurm_engine, "PLACE_TIMEOUT", 3600.0)
    session = nbddp.session(nodes=2, procs=1, cluster="slurm")
    lose_n2()
    try:
        with pytest.raises(RankExitedError, match=r"loss of node 1 .*Node failure on n2"):
            session.exec("import time\ntime.sleep(600)\n")
        started = time.monotonic()
        with pytest.raises(ConfigError) as info:
            session.restart()
        print(f"the restart said it in {time.monotonic() - started:.2f}s: {info.value}")
    finally:
        session.stop()
        bring_n2_back()
    # The job may be ending with the node (Slurm's default for a job that loses one).
    assert re.fullmatch(
        f"nbddp: node 1 \\(n2\\) is gone; Slurm job {in_allocation}( \\([A-Z_]+\\))? has "
        "1 node that fits this run, 2 asked for",
        str(info.value),
    ), info.value
