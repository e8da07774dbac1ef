"""A stand-in notebook: another process that drives the cluster (directly, or over
``ray://``), for what the test process cannot do to itself (be killed, be a client)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path

ROOT = Path(__file__).parents[2]

# The ranks' functions live in this checkout: it must be importable on the nodes, as a
# user's own modules must be. Over Ray Client the driver is not this process, so its
# directory is not on the workers' path by itself: the runtime_env puts it there.
CLUSTER = """
import os, sys
import nbddp
cluster = nbddp.RayCluster(sys.argv[1], runtime_env={"env_vars": {"PYTHONPATH": os.getcwd()}})
"""

NOTEBOOK = (
    CLUSTER
    + """
import time
from tests.cluster.ranks import sleep_forever
run = nbddp.launch(sleep_forever, nodes=2, procs=2, cluster=cluster, block=False)
while set(run.rank_states().values()) != {"running"}:
    time.sleep(0.05)
print("PIDS", *run.pids.values(), flush=True)
time.sleep(600)
"""
)


def stand_in_notebook(address: str) -> tuple[subprocess.Popen[str], list[int]]:
    """A separate process that launches sleeping ranks on the cluster; their pids."""
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(NOTEBOOK), address],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert proc.stdout is not None
    found: list[int] = []
    timer = threading.Timer(120, proc.kill)  # a stuck start must not hang the test
    timer.start()
    try:
        for line in proc.stdout:
            if line.startswith("PIDS"):
                found = [int(p) for p in line.split()[1:]]
                break
    finally:
        timer.cancel()
    assert len(found) == 4, "the stand-in notebook did not start its ranks"
    return proc, found


RESULTS = (
    CLUSTER
    + """
from tests.cluster.ranks import StepFailed, env_of_rank, fail_on_rank
env = nbddp.launch(env_of_rank, nodes=2, procs=2, cluster=cluster)
print("ENV", env["RANK"], env["WORLD_SIZE"], env["NODE_RANK"], flush=True)
try:
    nbddp.launch(fail_on_rank, 2, nodes=2, procs=2, cluster=cluster)
except StepFailed as exc:
    print("RAISED", type(exc).__name__, exc, flush=True)
"""
)


def results_through(address: str) -> str:
    """What a notebook driving ``address`` gets back from a run and a failing run."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(RESULTS), address],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=110,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout
