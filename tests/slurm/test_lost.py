"""What only Slurm can end: a job's time limit, and a node whose slurmd is gone (Slurm
declares it lost after ``SlurmdTimeout`` plus a ping, 43-48 s on the test cluster): the
run ends within seconds of Slurm saying so, naming why."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

import nbddp
from nbddp.errors import RankExitedError
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


@pytest.mark.timeout(240)
def test_a_node_slurm_loses_ends_the_run_naming_it(in_allocation: str) -> None:
    run = nbddp.launch(time.sleep, 600, nodes=2, procs=1, cluster="slurm", block=False)
    running(run)
    slurmd = int((LAB / "run" / "slurmd-n2.pid").read_text())
    os.kill(slurmd, signal.SIGKILL)
    try:
        with pytest.raises(RankExitedError, match=r"loss of node 1 .*Node failure on n2"):
            run.wait(timeout=200)
    finally:
        nbddp.cluster.release()
        subprocess.run(["bash", str(SCRIPT), "start"], check=True, timeout=120)
        # The node comes back to serve the next tests, and the allocation with it.
        deadline = time.monotonic() + 60
        while "n2 idle" not in slurm("sinfo", "-h", "-N", "-o", "%N %t") and (
            "n2 mix" not in slurm("sinfo", "-h", "-N", "-o", "%N %t")
        ):
            assert time.monotonic() < deadline, slurm("sinfo", "-N")
            time.sleep(0.2)
