"""A real two-node Slurm cluster on this machine (``cluster.sh``), and an allocation of
both nodes that the tests run in, as a notebook started inside ``salloc -N2`` does.

The cluster starts once for the session (about a second) and its allocation is
held throughout (``SLURM_JOB_ID`` is set in this process's environment only for
the tests here). After every test the agents kept are handed back and nothing of
the test is left: no rank, no agent, no job step; after the session, no job and
no Slurm daemon. Skipped where Slurm is not installed, except in CI
(``.ci/slurm.sh`` installs it there).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.procs import MARKER, wait_procs_gone

SCRIPT = Path(__file__).with_name("cluster.sh")
LAB = Path(os.environ.get("NBDDP_SLURMLAB", "/tmp/nbddp-slurm"))
CONF = str(LAB / "etc" / "slurm.conf")

COMMANDS = {
    c: shutil.which(c) for c in ("slurmctld", "slurmd", "srun", "munged", "squeue", "scancel")
}
if not all(COMMANDS.values()):
    if os.environ.get("CI"):
        raise RuntimeError("Slurm is not installed: .ci/slurm.sh installs it")
    pytest.skip("Slurm is not installed (.ci/slurm.sh)", allow_module_level=True)


def slurm(command: str, *args: str, check: bool = True) -> str:
    """A Slurm command's output, on the test cluster (found on PATH as the session began)."""
    done = subprocess.run(
        [COMMANDS.get(command) or command, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "SLURM_CONF": CONF},
    )
    if check and done.returncode != 0:
        raise RuntimeError(f"{command} {' '.join(args)}: {done.stderr}")
    return done.stdout


def steps(job: str) -> list[str]:
    """The job's steps that are running."""
    return slurm("squeue", "-h", "-s", "-j", job, "-o", "%i", check=False).split()


def other_jobs(allocation: str) -> list[str]:
    """The jobs in the queue besides the tests' own allocation."""
    return [j for j in slurm("squeue", "-h", "-o", "%i", check=False).split() if j != allocation]


def engine_threads() -> list[str]:
    """This process's threads that follow a step of agents or their connections."""
    names = ("nbddp-slurm-step", "nbddp-calls-", "nbddp-node")
    return [t.name for t in threading.enumerate() if t.name.startswith(names)]


def agents() -> list[psutil.Process]:
    """nbddp's agents that this test session started (by their command line)."""
    session = os.environ[MARKER]
    found = []
    for proc in psutil.process_iter():
        try:
            if "nbddp.agent.slurm_node" not in " ".join(proc.cmdline()):
                continue
            if proc.status() != psutil.STATUS_ZOMBIE and proc.environ().get(MARKER) == session:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def _allocate() -> str:
    """The job id of a new allocation of both nodes (with their two fake GPUs each)."""
    slurm("salloc", "-N2", "--gres=gpu:2", "--no-shell", "--job-name=nbddp-tests")
    return slurm("squeue", "-h", "--name=nbddp-tests", "-t", "RUNNING", "-o", "%i").split()[-1]


@pytest.fixture(scope="session")
def allocation() -> Iterator[list[str]]:
    """The tests' allocation, as a one-item list: a test that loses a node takes it down
    with the node, and the next test gets a new one."""
    subprocess.run(["bash", str(SCRIPT), "start"], check=True, timeout=120)
    try:
        yield [_allocate()]
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop"], check=True, timeout=120)
    left = [p for p in psutil.process_iter(["name"]) if p.info["name"] in ("slurmstepd",)]
    assert not left, f"Slurm step daemons left: {[p.pid for p in left]}"


@pytest.fixture(autouse=True)
def in_allocation(
    allocation: list[str], no_leftovers: None, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """Each test runs inside the allocation, and leaves no agent, step, job or rank."""
    import nbddp.cluster

    if slurm("squeue", "-h", "-j", allocation[0], "-o", "%T", check=False).strip() != "RUNNING":
        slurm("scancel", allocation[0], check=False)
        allocation[0] = _allocate()
    job = allocation[0]
    monkeypatch.setenv("SLURM_JOB_ID", job)
    monkeypatch.setenv("SLURM_CONF", CONF)
    yield job
    nbddp.cluster.release()
    left = wait_procs_gone(agents(), timeout=15.0)
    for proc in left:
        proc.kill()
    deadline = time.monotonic() + 15
    while (steps(job) or other_jobs(job)) and time.monotonic() < deadline:
        time.sleep(0.1)
    jobs = other_jobs(job)
    if jobs:
        slurm("scancel", *jobs, check=False)
    while engine_threads() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not engine_threads(), f"threads left: {engine_threads()}"
    assert not left, f"agents left: {[p.pid for p in left]}"
    assert not steps(job), f"job steps left: {steps(job)}"
    assert not jobs, f"jobs left: {jobs}"
