"""From a login node: nbddp asks Slurm for an allocation itself (``SlurmCluster(...)``),
says in the cell why it waits, cancels it on an interrupt, on ``release()``, when idle
and with the process, and keeps a named one for a later process."""

from __future__ import annotations

import _thread
import subprocess
import sys
import textwrap
import threading
import time

import psutil
import pytest

import nbddp
from nbddp.errors import ConfigError
from tests.cluster.ranks import env_of_rank
from tests.procs import wait_procs_gone
from tests.slurm.conftest import other_jobs, slurm


@pytest.fixture(autouse=True)
def on_a_login_node(monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside any allocation, as a notebook on a login node is."""
    monkeypatch.delenv("SLURM_JOB_ID")


def job_state(job: str) -> str:
    return slurm("squeue", "-h", "-j", job, "-o", "%T", check=False).strip()


def wait_until(done: object, what: str, within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    while not done():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_a_run_on_an_allocation_of_its_own_which_release_gives_back(
    in_allocation: str,
) -> None:
    env = nbddp.launch(env_of_rank, nodes=2, procs=1, cluster="slurm --time 10")
    assert env["WORLD_SIZE"] == "2"
    (job,) = other_jobs(in_allocation)
    assert job_state(job) == "RUNNING"
    said = nbddp.cluster.describe()
    assert said.startswith("slurm --time=10: 2 agents") and "time left 9:" in said, said
    nbddp.launch(env_of_rank, nodes=2, procs=1, cluster=nbddp.SlurmCluster(time="10"))  # warm
    assert other_jobs(in_allocation) == [job]
    nbddp.cluster.release()
    wait_until(lambda: not other_jobs(in_allocation), "the allocation was not given back")


def test_a_queued_request_says_why_and_an_interrupt_cancels_it(
    in_allocation: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # The tests' allocation holds a CPU of each node: an exclusive one must wait.
    timer = threading.Timer(4.0, _thread.interrupt_main)
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            nbddp.launch(env_of_rank, nodes=2, procs=1, cluster="slurm --exclusive")
    finally:
        timer.cancel()
    err = capsys.readouterr().err
    assert "pending (Resources), 0:0" in err or "pending (Priority), 0:0" in err, err
    wait_until(lambda: not other_jobs(in_allocation), "the queued request was not cancelled")


def test_a_request_slurm_refuses_is_one_line_in_its_words() -> None:
    with pytest.raises(ConfigError, match=r"Slurm refused the allocation: .*invalid partition"):
        nbddp.launch(env_of_rank, nodes=2, procs=1, cluster="slurm --partition nowhere")
    with pytest.raises(ConfigError, match="needs a name"):
        nbddp.SlurmCluster(keep=True)


def test_idle_agents_give_their_allocation_back(
    in_allocation: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NBDDP_CLUSTER_IDLE", "0")
    nbddp.launch(env_of_rank, nodes=2, procs=1, cluster="slurm --time 10")
    wait_until(lambda: not other_jobs(in_allocation), "the idle allocation was not given back")


KEEPER = """
import sys, time
import nbddp
cluster = sys.argv[1]
nbddp.launch(lambda: None, nodes=2, procs=1, cluster=cluster)
print("READY", flush=True)
time.sleep(600)
"""


def run_and_kill(cluster: str) -> None:
    """A stand-in notebook that runs on ``cluster``, SIGKILLed once its run is done."""
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(KEEPER), cluster], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "READY"
    proc.kill()
    proc.wait()


def test_a_killed_notebooks_allocation_goes_with_it_unless_kept(in_allocation: str) -> None:
    run_and_kill("slurm --time 10")
    wait_until(lambda: not other_jobs(in_allocation), "a killed notebook's allocation stayed")
    run_and_kill("slurm --time 10 --keep exp1")
    (kept,) = other_jobs(in_allocation)
    assert job_state(kept) == "RUNNING"
    # A later process asking for the same name runs on it, without queueing again.
    env = nbddp.launch(env_of_rank, nodes=2, procs=1, cluster="slurm --time 10 --keep exp1")
    assert env["WORLD_SIZE"] == "2" and other_jobs(in_allocation) == [kept]
    assert slurm("squeue", "-h", "-j", kept, "-o", "%j").strip() == "nbddp-exp1"
    nbddp.cluster.release()
    wait_until(lambda: not other_jobs(in_allocation), "release() left the kept allocation")


def test_a_killed_kernel_with_a_run_a_session_and_a_kept_allocation(in_allocation: str) -> None:
    from tests.kernel.kernel import Kernel, ok

    cluster = "'slurm --time 10 --keep exp2'"
    with Kernel() as doomed:
        ok(doomed, "%load_ext nbddp")
        result = doomed.execute(f"%ddp_session start --nodes 2 --procs 1 --cluster {cluster}", 180)
        assert result.status == "ok", result.text()
        result = ok(doomed, "%%ddp\nimport os\nprint('PID', os.getpid())")
        pids = [int(line.split()[-1]) for line in result.rank_output.splitlines() if "PID" in line]
        result = ok(
            doomed,
            "import nbddp, time\n"
            f"run = nbddp.launch(time.sleep, 600, nodes=2, procs=1, cluster={cluster},"
            " block=False)\n"
            "while len(run.pids) < 2: time.sleep(0.05)\n"
            "from nbddp.cluster import agents\n"
            "print(*run.pids.values(), *(i.pid for s in agents.kept() for i in s.infos))",
        )
        (kept,) = other_jobs(in_allocation)
        pids += [int(pid) for pid in result.stdout.split()]
        assert len(pids) == 6, pids  # two ranks of the run, two of the session, two agents
        procs = [psutil.Process(pid) for pid in pids]
        doomed.kill()
        assert not wait_procs_gone(procs, timeout=30), "alive 30 s after the kernel was killed"
    wait_until(lambda: not slurm("squeue", "-h", "-s", "-j", kept, "-o", "%i").split(), "steps")
    assert other_jobs(in_allocation) == [kept] and job_state(kept) == "RUNNING"
    env = nbddp.launch(env_of_rank, nodes=2, procs=1, cluster="slurm --time 10 --keep exp2")
    assert env["WORLD_SIZE"] == "2" and other_jobs(in_allocation) == [kept]
    nbddp.cluster.release()
    wait_until(lambda: not other_jobs(in_allocation), "release() left the kept allocation")
