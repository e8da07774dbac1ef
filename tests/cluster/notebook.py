"""A stand-in notebook: another process that drives the cluster (directly, or over
``ray://``), for what the test process cannot do to itself (be killed, be a client)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

ROOT = Path(__file__).parents[2]

# The ranks' functions are defined in the stand-in notebook itself, as a user's are in a
# notebook: they travel by value, so the nodes import nothing of this checkout (over Ray
# Client the driver is not this process, and its directory is on no worker's path).
CLUSTER = """
import os, sys, time
import nbddp


class StepFailed(Exception):
    pass


def env_of_rank():
    return {name: os.environ.get(name) for name in ("RANK", "WORLD_SIZE", "NODE_RANK")}


def fail_on_rank(bad):
    if int(os.environ["RANK"]) == bad:
        raise StepFailed(f"step failed on rank {bad}")
    time.sleep(60)  # stopped after the failure's grace


def sleep_forever():
    print("sleeping", flush=True)
    time.sleep(600)


cluster = sys.argv[1]
"""

NOTEBOOK = (
    CLUSTER
    + """
run = nbddp.launch(sleep_forever, nodes=2, procs=2, cluster=cluster, block=False)
while set(run.rank_states().values()) != {"running"}:
    time.sleep(0.05)
# One write, on a line of its own: the run's blocks are drawn on stdout meanwhile.
sys.stdout.write("\\nPIDS " + " ".join(map(str, run.pids.values())) + "\\n")
sys.stdout.flush()
time.sleep(600)
"""
)


SESSION = (
    CLUSTER
    + """
from nbddp.cluster import agents as nodes
session = nbddp.session(nodes=2, procs=1, cluster=cluster)
session.exec("import time\\nstarted = time.time()")
agents = [info.pid for info in nodes.kept()[-1].infos]
sys.stdout.write("\\nPIDS " + " ".join(map(str, [*session.pids.values(), *agents])) + "\\n")
sys.stdout.flush()
time.sleep(600)
"""
)


def stand_in_notebook(
    address: str, script: str = NOTEBOOK, count: int = 4
) -> tuple[subprocess.Popen[str], list[int]]:
    """A separate process that runs ``script`` (default: it launches sleeping ranks) on the
    cluster; the ``count`` pids it prints."""
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script), address],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert proc.stdout is not None
    found: list[int] = []
    timer = threading.Timer(240, proc.kill)  # a stuck start must not hang the test
    timer.start()
    try:
        for line in proc.stdout:
            if line.startswith("PIDS "):
                found = [int(p) for p in line.split()[1:]]
                break
    finally:
        timer.cancel()
    assert len(found) == count, "the stand-in notebook did not start its ranks"
    return proc, found


RESULTS = (
    CLUSTER
    + """
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
        timeout=240,
    )
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr[-3000:]}"
    return done.stdout


def kill_it_and_wait_for_its_ranks(
    address: str, within: float = 10.0, *, session: bool = False
) -> float:
    """Start a stand-in notebook on ``address`` (launching a run, or with ``session`` a
    session and showing also its agents' pids), SIGKILL it (and its tree) once its ranks
    run, and wait for them to go: seconds from the kill until they were all gone.
    Fails the test if any is alive ``within`` seconds after the kill."""
    import psutil

    from tests.cluster.conftest import kill_tree
    from tests.procs import wait_procs_gone

    proc, pids = stand_in_notebook(address, *((SESSION, 4) if session else ()))
    ranks = [psutil.Process(pid) for pid in pids]
    killed = time.monotonic()
    kill_tree(proc.pid)
    proc.wait()
    left = wait_procs_gone(ranks, timeout=within)
    assert not left, (
        f"ranks alive {within:g} s after the notebook was killed: {[p.pid for p in left]}"
    )
    return time.monotonic() - killed


# The keeper's look at the cluster (every second while agents are idle) made slow, so
# that it is in flight as the process exits: it waits for the exit to begin, then for the
# engine to shut down (up to a second each) before it reaches the engine.
EXITING = (
    CLUSTER
    + """
import ray
from nbddp.cluster import agents as nodes
from nbddp.cluster.ray_engine import RayEngine

look = RayEngine.others_waiting


def slow_look(self, holds):
    for ended in (lambda: all(a.released for a in nodes.kept()), lambda: not ray.is_initialized()):
        deadline = time.monotonic() + 1.0
        while not ended() and time.monotonic() < deadline:
            time.sleep(0.01)
    print("LOOKED", "after" if not ray.is_initialized() else "before", "shutdown", flush=True)
    return look(self, holds)


RayEngine.others_waiting = slow_look
nodes.KEEP_TICK = 0.01  # looking all the time
print("ENV", nbddp.launch(env_of_rank, nodes=2, procs=1, cluster=cluster)["RANK"], flush=True)
"""
)


def exit_while_looking(address: str) -> subprocess.CompletedProcess[str]:
    """A notebook that holds idle agents and exits while its keeper looks at the cluster."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(EXITING), address],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=240,
    )
