"""A real two-node Ray cluster on this machine, shared by the cluster tests.

The head node listens on 127.0.0.2 and the worker node on 127.0.0.3, each with
one CPU and two fake GPUs (Ray's ``num_gpus`` resource: CPU ranks only run
here). It starts once (seconds) for every module here; each module hands back
the agents it kept, so another driver (a stand-in notebook, a kernel) finds
the nodes free. The test process is the cluster's driver. After every test no
rank of it is left (``no_leftovers``); once the cluster is shut down, no Ray
process of it (gcs_server, raylet, workers, agents) and no nbddp process under
it is left. Skipped where ray is not installed.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from typing import TYPE_CHECKING

import psutil
import pytest

from tests.procs import MARKER, wait_procs_gone

if TYPE_CHECKING:
    from nbddp.cluster.agents import Agents

ray = pytest.importorskip("ray")
cluster_utils = pytest.importorskip("ray.cluster_utils")

HEAD = "127.0.0.2"
WORKER = "127.0.0.3"
CLIENT_PORT = 10001  # the head's Ray Client server (ray://127.0.0.2:10001)


@pytest.fixture(autouse=True)
def _no_rank_left(no_leftovers: None) -> None:
    """Every cluster test checks that none of its ranks outlives it."""


def node_args(address: str) -> dict[str, object]:
    return {
        "node_ip_address": address,
        "num_cpus": 1,
        "num_gpus": 2,
        "include_dashboard": False,
    }


@pytest.fixture(scope="module", autouse=True)
def _agents_released() -> Iterator[None]:
    """Each module starts and ends with no agent kept by this process."""
    import nbddp.cluster

    nbddp.cluster.release()
    yield
    nbddp.cluster.release()


@pytest.fixture(scope="session")
def cluster() -> Iterator[cluster_utils.Cluster]:
    """A running two-node cluster this process drives (see module docstring)."""
    head = {**node_args(HEAD), "ray_client_server_port": CLIENT_PORT}
    made = cluster_utils.Cluster(initialize_head=True, head_node_args=head)
    try:
        made.add_node(**node_args(WORKER))
        made.wait_for_nodes()
        yield made
    finally:
        import nbddp.cluster

        nbddp.cluster.release()
        ray.shutdown()
        made.shutdown()
        left = wait_procs_gone(ray_processes(), timeout=15.0)
        for proc in left:
            proc.kill()
        assert not left, f"Ray processes left behind: {[describe(p) for p in left]}"


def ray_processes() -> list[psutil.Process]:
    """Ray's processes (and nbddp's under them) that this test session started, orphans
    included (they carry the session marker in their environment)."""
    session = os.environ[MARKER]
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid == os.getpid() or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if proc.environ().get(MARKER) != session:
                continue
            text = " ".join(proc.cmdline()) + " " + proc.name()
            if "ray" in text or "gcs_server" in text:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def describe(proc: psutil.Process) -> str:
    try:
        return f"{proc.pid} {proc.name()} {' '.join(proc.cmdline())[:120]}"
    except psutil.Error:
        return str(proc.pid)


def newest() -> Agents:
    """The agents this process placed last (and has not handed back)."""
    from nbddp.cluster import agents as nodes

    sets = nodes.kept()
    assert sets, "this process holds no agents"
    return sets[-1]


@contextlib.contextmanager
def on_a_third_node(
    cluster: cluster_utils.Cluster, address: str, *, hold: bool = True
) -> Iterator[str]:
    """A third node on ``address`` for a test that loses a node: while the body places
    agents the worker node's CPU is held (unless not ``hold``: then a run of three nodes
    fits), so they go on the head and this node; the node is removed afterwards, and
    the two the other tests use are left as they were."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    import nbddp.cluster

    cluster.add_node(**node_args(address))
    try:
        cluster.wait_for_nodes()
        nbddp.cluster.release()
        if not hold:
            yield address
            return
        worker = next(
            n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeManagerAddress"] == WORKER
        )
        strategy = NodeAffinitySchedulingStrategy(worker, soft=False)
        holder = ray.remote(num_cpus=1)(_Holder).options(scheduling_strategy=strategy).remote()
        try:
            ray.get(holder.ready.remote())
            yield address
        finally:
            ray.kill(holder)
    finally:
        node = next((n for n in cluster.list_all_nodes() if n.node_ip_address == address), None)
        if node is not None:
            cluster.remove_node(node, allow_graceful=False)


class _Holder:
    """Holds a node's CPU while it lives."""

    def ready(self) -> bool:
        return True


def kill_tree(pid: int) -> None:
    """SIGKILL one process (the stand-in notebook), nothing else."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
