"""Runs across the two nodes of a real Slurm allocation (``conftest.allocation``): the
same values, output, errors, stops and cleanup as on one machine or on Ray."""

from __future__ import annotations

import logging
import os
import socket
import time
from pathlib import Path

import psutil
import pytest

import nbddp
from nbddp.cluster import agents as kept
from nbddp.cluster import slurm_engine
from nbddp.errors import ConfigError, RankError, RankExitedError
from nbddp.launcher.events import RankState
from nbddp.wire import calls
from tests.answers import MB, SIZES, answer_with, expected, line_of
from tests.cluster.notebook import SESSION, stand_in_notebook
from tests.cluster.ranks import (
    StepFailed,
    all_reduce_ranks,
    env_of_rank,
    fail_on_rank,
    sleep_in_a_named_function,
    wait_for,
)
from tests.multiproc import fns
from tests.procs import wait_procs_gone
from tests.slurm.conftest import COMMANDS, agents, slurm, steps

SLURM_NAMES = ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_NODEID", "SLURMD_NODENAME")


def slurm_env() -> dict[str, str | None]:
    return {name: os.environ.get(name) for name in ("RANK", *SLURM_NAMES)}


def newest() -> kept.Agents:
    sets = kept.kept()
    assert sets, "this process holds no agents"
    return sets[-1]


def test_ranks_on_both_nodes_form_one_group_with_torchs_and_slurms_numbers_agreeing(
    tmp_path: Path,
) -> None:
    gate = tmp_path / "gate"
    run = nbddp.launch(all_reduce_ranks, str(gate), nodes=2, procs=2, cluster="slurm", block=False)
    deadline = time.monotonic() + 60
    while not all("ready on rank" in run.output(r) for r in range(4)):
        assert time.monotonic() < deadline, [run.output(r) for r in range(4)]
        time.sleep(0.05)
    gate.touch()
    result = run.wait()
    assert result.values[0]["sum"] == 0 + 1 + 2 + 3
    for rank, value in result.values.items():
        env = value["env"]
        assert (env["RANK"], env["LOCAL_RANK"], env["NODE_RANK"]) == (
            str(rank),
            str(rank % 2),
            str(rank // 2),
        )
        assert env["WORLD_SIZE"] == "4" and env["MASTER_ADDR"] == "127.0.0.1"
    names = nbddp.launch(slurm_env, nodes=2, procs=2, cluster="slurm", block=False).wait()
    for rank, env in names.values.items():
        assert env == {
            "RANK": str(rank),
            "SLURM_PROCID": str(rank),
            "SLURM_LOCALID": str(rank % 2),
            "SLURM_NTASKS": "4",
            "SLURM_NODEID": str(rank // 2),
            "SLURMD_NODENAME": f"n{rank // 2 + 1}",
        }
    # The step's GPUs are the job's (two fake ones per node), and nodes are named as Slurm does.
    assert [(i.hostname, i.gpu_ids) for i in newest().infos] == [
        ("n1", ("0", "1")),
        ("n2", ("0", "1")),
    ]


def test_notebook_launcher_runs_on_the_cluster_nbddp_cluster_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NBDDP_CLUSTER", "slurm")
    nbddp.notebook_launcher(all_reduce_ranks, (str(Path(__file__)),), num_processes=1, num_nodes=2)
    (agents_set,) = kept.kept()
    assert agents_set.shape[:2] == (f"Slurm job {os.environ['SLURM_JOB_ID']}", 2)


def test_a_warm_launch_reuses_the_agents_and_describe_names_the_job(in_allocation: str) -> None:
    nbddp.launch(env_of_rank, nodes=2, procs=1, cluster="slurm")
    agents_before = newest()
    env = nbddp.launch(env_of_rank, nodes=2, procs=1, cluster="slurm")
    assert newest() is agents_before and env["WORLD_SIZE"] == "2"
    said = nbddp.cluster.describe()
    assert said.startswith(f"Slurm job {in_allocation}: 2 agents (a CPU per node) on node 0 n1")
    assert "node 1 n2 (127.0.0.1)" in said and "time left UNLIMITED" in said
    assert len(steps(in_allocation)) == 1


def test_a_ranks_own_exception_is_raised_with_its_type_and_stops_the_others() -> None:
    started = time.monotonic()
    with pytest.raises(StepFailed, match="step failed on rank 3") as info:
        nbddp.launch(fail_on_rank, 3, nodes=2, procs=2, cluster="slurm")
    assert time.monotonic() - started < 30  # not the others' 60 s sleep
    assert "StepFailed" in str(info.value.__cause__)


def test_a_timeout_dumps_every_ranks_stacks_on_both_nodes_then_stops() -> None:
    run = nbddp.launch(
        sleep_in_a_named_function, nodes=2, procs=1, cluster="slurm", timeout=3, block=False
    )
    with pytest.raises(nbddp.LaunchTimeout, match="the stacks of ranks 0, 1 are in the output"):
        run.wait()
    for rank in (0, 1):
        assert "stuck_here_for_a_while" in run.output(rank), run.output(rank)


def test_two_runs_at_once_share_the_agents_and_end_on_their_own(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    first = nbddp.launch(
        wait_for, str(gate), "first", nodes=2, procs=1, cluster="slurm", block=False
    )
    second = nbddp.launch(env_of_rank, nodes=2, procs=1, cluster="slurm", block=False)
    assert second.wait().values[0]["WORLD_SIZE"] == "2"
    assert first.status == "running"
    gate.touch()
    assert first.wait().values == {0: "first", 1: "first"}
    assert len(kept.kept()) == 1


def test_stop_ends_every_rank_on_every_node_within_seconds() -> None:
    run = nbddp.launch(time.sleep, 600, nodes=2, procs=2, cluster="slurm", block=False)
    deadline = time.monotonic() + 60
    while set(run.rank_states().values()) != {RankState.RUNNING}:
        assert time.monotonic() < deadline, run.rank_states()
        time.sleep(0.05)
    procs = [psutil.Process(pid) for pid in run.pids.values()]
    run.stop()
    with pytest.raises(RankError, match="stopped"):
        run.wait()
    assert not wait_procs_gone(procs, timeout=10)


@pytest.mark.parametrize("how", ["agent killed", "step cancelled"])
def test_losing_an_agent_ends_the_run_within_seconds_naming_the_node(
    how: str, in_allocation: str
) -> None:
    nbddp.launch(env_of_rank, nodes=2, procs=1, cluster="slurm")  # what stays is made
    nbddp.cluster.release()
    fds = psutil.Process().num_fds()
    run = nbddp.launch(time.sleep, 600, nodes=2, procs=1, cluster="slurm", block=False)
    deadline = time.monotonic() + 60
    while set(run.rank_states().values()) != {RankState.RUNNING}:
        assert time.monotonic() < deadline, run.rank_states()
        time.sleep(0.05)
    lost = time.monotonic()
    if how == "agent killed":
        psutil.Process(newest().infos[1].pid).kill()
        match = r"rank 1 ended with the loss of node 1 \(127.0.0.1\), which ran rank 1 "
        match += r"\(Slurm: n2: task 1: Killed\)"
    else:
        slurm("scancel", f"{in_allocation}.{steps(in_allocation)[0].split('.')[1]}")
        # Slurm ends every task of the step: whichever it reports first is named.
        match = r"ended with the loss of node \d \(127.0.0.1\), which ran rank \d \(Slurm: "
        match += r"(STEP \d+\.\d+ ON n\d CANCELLED|n\d: task \d: (Killed|Terminated))"
    with pytest.raises(RankExitedError, match=match):
        run.wait()
    assert time.monotonic() - lost < 15
    del run
    nbddp.cluster.release()  # the broken agents' step, their connections and srun's pipe
    deadline = time.monotonic() + 10
    while psutil.Process().num_fds() > fds and time.monotonic() < deadline:
        time.sleep(0.1)
    assert psutil.Process().num_fds() <= fds


def test_what_the_allocation_lacks_is_said_in_one_line_before_anything_starts(
    monkeypatch: pytest.MonkeyPatch, in_allocation: str
) -> None:
    with pytest.raises(
        ConfigError, match=f"needs 3 nodes, but Slurm job {in_allocation} has 2: n1, n2"
    ):
        nbddp.launch(env_of_rank, nodes=3, procs=1, cluster="slurm")
    assert not steps(in_allocation)
    with pytest.raises(
        ConfigError, match=f"4 GPUs per node, but Slurm gave job {in_allocation} 2 on n1"
    ):
        nbddp.launch(env_of_rank, nodes=2, gpus=4, cluster="slurm")
    monkeypatch.delenv("SLURM_JOB_ID")
    with pytest.raises(ConfigError, match="runs in none \\(no SLURM_JOB_ID\\)") as info:
        nbddp.launch(env_of_rank, nodes=2, procs=1, cluster="slurm")
    assert "\n" not in str(info.value)
    monkeypatch.setenv("SLURM_JOB_ID", in_allocation)
    monkeypatch.setenv("PATH", "/nowhere")
    with pytest.raises(ConfigError, match="needs Slurm's srun on PATH"):
        nbddp.launch(env_of_rank, nodes=2, procs=1, cluster="slurm")


def test_a_connection_without_the_secret_is_refused_and_logged_and_the_secret_is_on_no_command_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Nothing a stranger sends is unpickled before the secret is proved.
    ours, theirs = socket.socketpair()
    with ours, theirs:
        theirs.sendall(b"x" * 32 + b"a pickle that would run code")
        assert calls.proven(ours, "s" * 32) is None
    accept = slurm_engine._accept

    def stranger_first(server: socket.socket, *args: object) -> object:
        stranger = socket.create_connection(server.getsockname()[:2])
        stranger.sendall(b"not the secret, but as long as one")
        try:
            return accept(server, *args)  # type: ignore[arg-type]
        finally:
            stranger.close()

    monkeypatch.setattr(slurm_engine, "_accept", stranger_first)
    with caplog.at_level(logging.WARNING, logger="nbddp"):
        env = nbddp.launch(env_of_rank, nodes=2, procs=1, cluster="slurm")
    assert env["WORLD_SIZE"] == "2"
    assert "refused a connection from ('127.0.0.1'" in caplog.text
    lines = [" ".join(p.cmdline()) for p in agents()]  # the agents and srun's processes
    assert sum(not line.startswith(COMMANDS["srun"] or "srun") for line in lines) == 2
    assert not any(calls_secret_in(line) for line in lines)


def calls_secret_in(line: str) -> bool:
    from nbddp.agent.slurm_node import SECRET

    return SECRET in line or any(len(word) == 32 and word.isalnum() for word in line.split())


def test_a_node_with_other_versions_is_named_before_anything_runs(
    monkeypatch: pytest.MonkeyPatch, in_allocation: str
) -> None:
    ours = slurm_engine.local_versions()  # a node without Ray is fine on Slurm
    fake = {**ours, "nbddp": "0.0.1", "ray": "1.0"}
    monkeypatch.setattr(slurm_engine, "local_versions", lambda: fake)
    differs = r"n1 \(127.0.0.1\) has different versions than this notebook \(nbddp [^;]*\); "
    with pytest.raises(ConfigError, match=differs + "install the same versions there$") as info:
        nbddp.launch(env_of_rank, nodes=2, procs=1, cluster="slurm")
    assert "\n" not in str(info.value)
    assert not steps(in_allocation) and not kept.kept()


def test_a_session_keeps_its_state_across_cells_on_both_nodes() -> None:
    with nbddp.session(nodes=2, procs=1, cluster="slurm") as session:
        session.exec("import os\nnode = os.environ['SLURMD_NODENAME']\nvalue = 10 * rank\n")
        session.exec("value += 1")
        gather = (
            "import torch.distributed as dist\neveryone = [None] * world_size\n"
            "dist.all_gather_object(everyone, (node, value))\neveryone\n"
        )
        assert session.exec(gather) == [("n1", 1), ("n2", 11)]


def test_killing_the_notebook_leaves_nothing_on_any_node(in_allocation: str) -> None:
    proc, pids = stand_in_notebook("slurm", SESSION, 4)
    procs = [psutil.Process(pid) for pid in pids]
    proc.kill()
    proc.wait()
    assert not wait_procs_gone(procs, timeout=10)
    deadline = time.monotonic() + 15
    while steps(in_allocation) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not steps(in_allocation)


def test_answers_of_1_16_and_64_mb_reach_a_rank_on_the_other_node_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lines = [line_of(size) for size in SIZES]
    answer_with(monkeypatch, lines)
    run = nbddp.launch(
        fns.read_lines, len(lines), 1, nodes=2, procs=1, cluster="slurm", timeout=90, block=False
    )
    got = run.wait().values[1]  # rank 1: node 1, not the store's node
    assert [(n, sha) for n, sha, _ in got] == expected(lines)
    for size, (_, _, took) in zip(SIZES, got, strict=True):
        print(f"answer of {size // MB} MB to a rank on another Slurm node: {took:.2f}s")
