"""A run across nodes, before anything starts: the ``nodes`` and ``cluster`` options,
each node's environment, the versions check and what crosses between machines."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest
import torch

from nbddp import RayCluster, SlurmCluster, entry, notebook_launcher
from nbddp.agent.portable import land, land_payload, ship, ship_payload
from nbddp.errors import ConfigError, PayloadError, RankExitedError
from nbddp.launcher.clusters import as_cluster
from nbddp.launcher.config import LaunchConfig, NodeSlice
from nbddp.launcher.events import Failure
from nbddp.launcher.failures import rank_error
from nbddp.launcher.spelling import FLAGS
from nbddp.wire.descriptors import OwnedFd, Packed
from nbddp.wire.payload import Payload, load_call
from nbddp.wire.shm import Mark
from nbddp.wire.values import pack, unpack
from nbddp.wire.versions import mismatch
from tests.unit import configs
from tests.unit.configs import NO_GPU

ROOT = Path(__file__).parents[2]


def build(**options: Any) -> LaunchConfig:
    return configs.build(environ={}, **options)


def test_ranks_per_node_times_nodes_is_the_world_and_gpus_are_the_nodes_own() -> None:
    config = build(nodes=2, gpus=8, cluster="ray://head:10001")  # none visible here: fine
    assert (config.job.world_size, config.job.device, config.job.backend) == (16, "cuda", "nccl")
    assert config.cluster == RayCluster("ray://head:10001")
    cpu = build(nodes=3, procs=2, cluster=RayCluster("ray", runtime_env={"pip": ["x"]}))
    assert (cpu.job.world_size, cpu.job.device, cpu.nodes) == (6, "cpu", 3)
    assert cpu.cluster is not None and cpu.cluster.ray_address == "auto"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"nodes": 2, "procs": 1},
            "nodes=2 needs a cluster: add cluster='slurm' inside a Slurm allocation, or "
            "cluster='ray://head:10001'",
        ),
        ({"nodes": 0, "procs": 1}, "nodes must be at least 1, got 0"),
        (
            {"cluster": "head", "procs": 1},
            "cluster 'head' is not a Ray address; use 'ray://head:10001'",
        ),
        (
            {"cluster": "", "procs": 1},
            "cluster must be 'slurm' (the Slurm allocation this runs in), a Ray address",
        ),
        (
            {"cluster": "ray", "gpus": [0, 1]},
            "on a cluster gpus is a count per node, such as gpus=8",
        ),
        ({"cluster": "ray"}, "on a cluster, say how many ranks each node runs: gpus=N"),
        ({"cluster": "ray", "procs": 1, "gpus": 1}, "give either gpus=N (GPUs per node)"),
        ({"cluster": "ray", "procs": 1, "start_method": "fork"}, "start_method='fork' cannot"),
        ({"cluster": "ray", "procs": 1, "max_restarts": 1}, "max_restarts is not supported"),
    ],
)
def test_a_cluster_launch_that_cannot_work_is_refused_in_one_line(
    options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        build(**options)
    assert str(info.value).startswith(message), str(info.value)
    assert "\n" not in str(info.value)


def test_the_magics_spell_the_cluster_options_as_flags() -> None:
    needs = r"^--nodes 2 needs a cluster: add --cluster slurm inside .* or --cluster ray://"
    with pytest.raises(ConfigError, match=needs), FLAGS.speaking():
        LaunchConfig.build(visible=NO_GPU, nodes=2, procs=1)


def test_each_node_gives_its_ranks_torchruns_environment() -> None:
    spec = build(nodes=2, gpus=2, cluster="ray").job
    node = NodeSlice(
        node_rank=1,
        nodes=2,
        first_rank=2,
        ranks=2,
        master_addr="10.0.0.2",
        port=29400,
        gpu_tokens=("6", "7"),
    )
    env = spec.rank_env(node, 1, 29400)
    assert {k: env[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")} == {
        "RANK": "3",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": "2",
    }
    assert (env["NODE_RANK"], env["GROUP_RANK"], env["ROLE_RANK"]) == ("1", "1", "3")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.0.0.2", "29400")
    assert env["CUDA_VISIBLE_DEVICES"] == "6,7"
    assert spec.world_size == 4  # torch's world size, on every node
    whole = spec.local()  # the run on one machine: every rank, from rank 0
    assert (whole.first_rank, whole.ranks, whole.port) == (0, 4, None)


def test_notebook_launcher_runs_across_nodes_only_with_a_configured_cluster(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("NBDDP_CLUSTER", raising=False)
    with pytest.raises(ConfigError, match=r"^num_nodes=2 needs a cluster: set NBDDP_CLUSTER=slurm"):
        notebook_launcher(print, num_nodes=2)
    with pytest.raises(ConfigError, match=r"^node_rank and rdzv_\* are not used"):
        notebook_launcher(print, num_nodes=2, node_rank=1)
    monkeypatch.setenv("NBDDP_CLUSTER", "ray://head:10001")

    class Built(Exception):
        pass

    seen: dict[str, Any] = {}

    def capture(**kwargs: Any) -> LaunchConfig:
        seen.update(kwargs)
        raise Built

    monkeypatch.setattr(entry.LaunchConfig, "build", capture)
    with pytest.raises(Built):
        notebook_launcher(print, num_processes=8, num_nodes=2)
    assert (seen["nodes"], seen["cluster"]) == (2, RayCluster("ray://head:10001"))


def test_a_version_that_differs_names_the_node_and_what_differs() -> None:
    ours = {
        "python": "3.11",
        "ray": "2.60.0",
        "torch": "2.13.0",
        "cloudpickle": "3.1.2",
        "nbddp": "0.1.0",
    }
    assert mismatch(ours, dict(ours), "10.0.0.3 (gpu-2)") is None
    theirs = {**ours, "torch": "2.12.1", "python": "3.10"}
    text = mismatch(ours, theirs, "10.0.0.3 (gpu-2)")
    assert text is not None and "\n" not in text
    assert text.startswith("node 10.0.0.3 (gpu-2) has different versions than this notebook (")
    assert "python 3.10 there, 3.11 here; torch 2.12.1 there, 2.13.0 here" in text


def test_without_ray_a_cluster_launch_says_how_to_install_it() -> None:
    code = """
        import sys
        sys.modules["ray"] = None  # as if not installed
        import nbddp
        try:
            nbddp.launch(print, nodes=2, procs=1, cluster="127.0.0.1:1")
        except nbddp.ConfigError as exc:
            print(exc)
    """
    env = {**os.environ, "NBDDP_PREWARM": "0", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.stdout.startswith("running on a cluster needs Ray: pip install nbddp[ray]"), done


def test_a_value_and_its_large_tensor_cross_machines_as_bytes_and_land_in_shared_memory() -> None:
    big = torch.arange(1 << 18, dtype=torch.float32)
    packed = pack({"weights": big, "step": 3})
    assert len(packed.fds) == 1
    shipped = ship([packed])
    packed.fds.close()
    (landed_packed,) = cast(list[Packed], land(shipped))
    landed = unpack(landed_packed)
    assert landed["step"] == 3 and torch.equal(landed["weights"], big)
    assert landed["weights"].untyped_storage().is_shared()


def test_the_call_and_its_large_arguments_cross_as_bytes() -> None:
    big = torch.ones(1 << 18)
    payload = Payload.serialize(torch.sum, (big,), {})
    assert payload.fds
    landed = land_payload(ship_payload(payload), {})
    call = load_call(landed.ref())
    assert torch.equal(call.args[0], big)


def test_a_node_is_not_sent_again_what_it_holds_unchanged() -> None:
    data = torch.arange(10 << 20, dtype=torch.float32)  # 40 MiB, shared in place
    kept: dict[Mark, OwnedFd] = {}
    first = Payload.serialize(torch.sum, (data,), {})
    land_payload(ship_payload(first), kept)
    held = frozenset(first.marks.values())
    again = Payload.serialize(torch.sum, (data[5:],), {})  # the same tensor, unchanged
    shipped = ship_payload(again, held)
    assert shipped[1] == (None,)  # nothing of it travels
    call = load_call(land_payload(shipped, kept).ref())
    assert torch.equal(call.args[0], data[5:])
    data[7] = -1.0  # an in-place write changes the tensor's version: it goes again
    changed = Payload.serialize(torch.sum, (data,), {})
    shipped = ship_payload(changed, frozenset(again.marks.values()))
    assert shipped[1] != (None,)
    assert float(load_call(land_payload(shipped, kept).ref()).args[0][7]) == -1.0


def test_a_node_keeps_what_the_notebook_still_holds_across_cells_that_do_not_read_it() -> None:
    data = torch.ones(10 << 20)  # 40 MiB, shared in place
    kept: dict[Mark, OwnedFd] = {}
    held: frozenset[Mark] = frozenset()
    sent = []
    for args in ((data,), (), (data,)):  # a cell between reads nothing
        shipped = ship_payload(Payload.serialize(torch.sum, args, {}), held)
        held = shipped[3]
        sent.append(shipped[1])
        land_payload(shipped, kept)
    assert sent[2] == (None,) and len(kept) == 1
    del data, args
    gc.collect()  # gone from the notebook: the nodes let it go at the next cell
    shipped = ship_payload(Payload.serialize(torch.sum, (), {}), held)
    land_payload(shipped, kept)
    assert shipped[3] == frozenset() and kept == {}


def test_a_multiprocessing_object_cannot_go_to_another_machine() -> None:
    import multiprocessing

    queue = multiprocessing.get_context("spawn").SimpleQueue()
    payload = Payload.serialize(print, (queue,), {})
    with pytest.raises(PayloadError, match="cannot be sent to ranks on other machines"):
        ship_payload(payload)


def test_a_rank_lost_with_its_node_says_so() -> None:
    why = "the loss of node 1 (10.0.0.3), which ran ranks 2, 3,"
    exc = rank_error(Failure(2, "died", cause=why), None, Path("/logs"))
    assert isinstance(exc, RankExitedError)
    assert str(exc).startswith(
        "rank 2 ended with the loss of node 1 (10.0.0.3), which ran ranks 2, 3, before returning;"
    )


def test_the_panel_form_takes_the_nodes_and_the_cluster_and_writes_them_as_code() -> None:
    from nbddp.notebook.panel.code import CallSource, run_code
    from nbddp.notebook.panel.settings import PanelSettings

    settings = replace(PanelSettings.initial(0), procs=2, nodes="2", cluster=" ray://head:10001 ")
    validated = settings.validate()
    assert validated.errors == {}
    assert validated.config is not None
    assert (validated.config.job.world_size, validated.config.nodes) == (4, 2)
    assert validated.config.cluster == RayCluster("ray://head:10001")
    train = CallSource("train", (), ())
    magic, launch = run_code(train, settings)
    assert "--procs 2 --nodes 2 --cluster ray://head:10001" in magic
    assert "nodes=2, cluster='ray://head:10001'" in launch
    assert replace(settings, nodes="two").validate().errors == {
        "nodes": "a number of machines (1 or more), or empty for this one; got 'two'"
    }
    slurm = replace(settings, cluster="slurm --time 10")
    assert slurm.validate().errors == {}
    assert "--nodes 2 --cluster 'slurm --time 10'" in run_code(train, slurm)[0]
    assert replace(settings, cluster="").validate().errors == {
        "launch": "Nodes 2 needs a cluster: add Cluster slurm inside a Slurm allocation, or "
        "Cluster ray://head:10001 (or 'ray' inside a Ray cluster)"
    }


class FakeRay:
    """``ray`` as ``nodes.connect`` uses it: ``init`` fails with the given errors first."""

    def __init__(self, failures: list[Exception]) -> None:
        self.failures = failures
        self.inits = 0
        self.shutdowns = 0
        self.connected = False

    def is_initialized(self) -> bool:
        return self.connected

    def init(self, **kwargs: object) -> None:
        self.inits += 1
        if self.failures:
            raise self.failures.pop(0)
        self.connected = True

    def shutdown(self) -> None:
        self.shutdowns += 1
        self.connected = False


CLIENT_SERVER_FAILED = ConnectionAbortedError(
    "Initialization failure from server:\nTraceback (most recent call last):\n"
    "RuntimeError: Starting Ray client server failed. See ray_client_server_23000.err"
)


@pytest.fixture
def fake_ray(monkeypatch: pytest.MonkeyPatch) -> Any:
    from nbddp.cluster import ray_engine as nodes

    monkeypatch.setattr(nodes, "probe", lambda address: None)
    monkeypatch.setattr(nodes, "_connected", None)
    monkeypatch.setenv("RAY_CLIENT_RECONNECT_GRACE_PERIOD", "2")

    def use(failures: list[Exception]) -> FakeRay:
        ray = FakeRay(failures)
        monkeypatch.setattr(nodes, "import_ray", lambda: ray)
        return ray

    return use


def test_a_client_server_that_fails_to_start_is_tried_again(fake_ray: Any) -> None:
    from nbddp.cluster import ray_engine as nodes

    ray = fake_ray([CLIENT_SERVER_FAILED, CLIENT_SERVER_FAILED])
    assert nodes.connect(RayCluster("ray://127.0.0.2:10001")) is ray
    assert ray.inits == 3 and ray.shutdowns == 2 and ray.connected


def test_a_client_server_that_never_starts_says_so_in_one_line(fake_ray: Any) -> None:
    from nbddp.cluster import ray_engine as nodes

    ray = fake_ray([CLIENT_SERVER_FAILED] * nodes.CLIENT_START_TRIES)
    with pytest.raises(ConfigError) as info:
        nodes.connect(RayCluster("ray://127.0.0.2:10001"))
    assert ray.inits == nodes.CLIENT_START_TRIES
    assert "cannot connect to the Ray cluster at ray://127.0.0.2:10001" in str(info.value)
    assert "\n" not in str(info.value)


def test_other_connection_failures_are_not_tried_again(fake_ray: Any) -> None:
    from nbddp.cluster import ray_engine as nodes

    ray = fake_ray(
        [ConnectionAbortedError("Initialization failure from server:\nversion mismatch")]
    )
    with pytest.raises(ConfigError):
        nodes.connect(RayCluster("ray://127.0.0.2:10001"))
    assert ray.inits == 1


def test_slurm_clusters_are_spelled_as_salloc_flags_and_read_back() -> None:
    assert as_cluster("slurm") == SlurmCluster() and not SlurmCluster().submits
    given = as_cluster("'slurm --partition gpu --time=1:00:00 --exclusive --keep exp1'")
    assert given == SlurmCluster(
        partition="gpu", time="1:00:00", extra_args=("--exclusive",), keep=True, name="exp1"
    )
    assert given.submits and as_cluster(str(given)) == given
    listed = SlurmCluster(partition="gpu", extra_args=["--exclusive"])
    assert as_cluster(str(listed)) == listed and not SlurmCluster(extra_args=[]).submits
    assert given.salloc_args() == ["--partition=gpu", "--time=1:00:00", "--exclusive"]
    with pytest.raises(ValueError, match="argument --gpus-per-node: invalid int value: 'two'"):
        as_cluster("slurm --gpus-per-node two")
    with pytest.raises(ConfigError, match=r"keep=True\) needs a name"):
        SlurmCluster(keep=True)


def test_inside_a_slurm_job_each_rank_gets_slurms_task_variables_as_torchs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    config = build(nodes=2, procs=2, cluster="slurm")
    node = NodeSlice(1, 2, 2, 2, "10.0.0.1", 29500, address="10.0.0.2")
    env = config.job.rank_env(node, 1, 29500)
    assert {k: v for k, v in env.items() if k.startswith("SLURM_")} == {
        "SLURM_PROCID": "3",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "1",
        "SLURM_NTASKS": "4",
        "SLURM_NPROCS": "4",
        "SLURM_STEP_NUM_TASKS": "4",
        "SLURM_NTASKS_PER_NODE": "2",
        "SLURM_TASKS_PER_NODE": "2(x2)",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
        "SLURM_GTIDS": "2,3",
    }
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"]) == ("3", "1", "4")
    monkeypatch.delenv("SLURM_JOB_ID")
    assert not any(k.startswith("SLURM_") for k in config.job.rank_env(node, 1, 29500))


def test_the_address_slurm_agents_reach_the_notebook_on_can_be_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from nbddp.cluster import slurm_engine

    monkeypatch.setenv("NBDDP_SLURM_ADDRESS", "10.1.2.3")
    monkeypatch.setattr(slurm_engine, "_scontrol", lambda *args: pytest.fail("asked Slurm"))
    assert slurm_engine._notebook_address("n1") == "10.1.2.3"


class _GoneEngine:
    """An engine still connected, whose agents do not answer."""

    def connected(self) -> bool:
        return True


class _GoneChannel:
    def call(self, method: str, *args: object) -> Any:
        raise ConnectionError("the node is gone")


def test_placement_looks_again_while_it_waits_and_names_a_lost_node_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import threading

    from nbddp.agent.node import NodeInfo
    from nbddp.cluster import agents as held

    monkeypatch.setattr(held, "_lost_nodes", {})  # nodes other tests' agents lost

    infos = [NodeInfo(f"10.9.0.{i}", "h", 1, (), {}, node_id=f"unit-{i}") for i in range(2)]
    engine: Any = _GoneEngine()
    lost = held.Agents(("ray://x", 2, 0, 1), engine, None, [_GoneChannel()] * 2, infos)
    lost.follow()
    for thread in threading.enumerate():
        if thread.name.startswith("nbddp-node"):
            thread.join()
    assert lost.broken
    huge = 3600.0  # a pass proves the timeout was not waited for
    # Node 1 leaves the cluster while placement waits: said at the next look.
    looks = iter([["unit-0", "unit-1", "other"], ["unit-0", "other"]])
    with pytest.raises(ConfigError) as info:
        held.wait_placed(lambda seconds: False, lambda: next(looks), 3, huge, "the cluster")
    assert str(info.value) == (
        "nbddp: node 1 (10.9.0.1) is gone; the cluster has 2 nodes that fit this run, 3 asked for"
    )
    # A node not this notebook's goes: what is left, without naming one.
    both = ["unit-0", "unit-1"]
    with pytest.raises(ConfigError, match=r"^the cluster has 2 of the 3 nodes this run needs now$"):
        held.wait_placed(lambda seconds: False, lambda: both, 3, huge, "the cluster")
    # A node joins and the group is placed: no error.
    placed = iter([False, True])
    held.wait_placed(lambda seconds: next(placed), lambda: ["unit-0", "new"], 2, huge, "it")
    # Enough nodes, never free: the timeout, naming who holds them.
    with pytest.raises(ConfigError, match=r"within 0s \(other jobs hold them\); retry later$"):
        held.wait_placed(lambda seconds: False, lambda: ["unit-0", "new"], 2, 0.0, "the cluster")
