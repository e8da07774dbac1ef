"""The Ray engine: placement and a channel, and the only module that starts Ray things.

Contract: ``import_ray()`` imports ray or raises ``ConfigError`` saying to ``pip install
nbddp[ray]``. ``connect(cluster)`` makes this process a driver of ``cluster`` (reusing the
connection when it is the same cluster), after a probe (``probe``) so that a wrong or silent address
fails in seconds with one line. ``place(config)`` returns ``agents.Agents`` for a run: kept ones of
the same shape, or one ``agent.NodeAgent`` actor per node in a placement group of one bundle per
node (strict spread), each checked to run the notebook's versions, node 0 on the head node when it
is one of them, then by address. A cluster too small is named in one line with what it has. Each
agent's channel is its actor handle; a value shared with every node is put in Ray's object store
once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from typing import Any

from nbddp.agent.node import NodeInfo
from nbddp.agent.ray_node import RayNodeAgent
from nbddp.cluster import agents as held
from nbddp.cluster.agents import Agents, Channel, Engine, Shape, keep, release_agents, reuse
from nbddp.cluster.probe import probe
from nbddp.errors import ConfigError
from nbddp.launcher.clusters import RayCluster
from nbddp.launcher.config import LaunchConfig
from nbddp.launcher.spelling import OptionError
from nbddp.wire.versions import local_versions, mismatch

log = logging.getLogger(__name__)

PLACE_TIMEOUT = 60.0  # seconds the placement group and the agents get to be ready
AGENT_CONCURRENCY = 32  # an agent's threads: a long poll never holds up a stop
CLIENT_GRACE = "2"  # seconds Ray Client waits for a lost notebook (its default: 30)
CLIENT_START_TRIES = 3
"""Connections tried when Ray Client's proxy fails to start the notebook's own server process
(it forks it from a gRPC-threaded one, which at times dies at once); each try starts afresh."""

Ray = Any
"""Ray ships no types: its module, actor handles, placement groups and node records."""


def import_ray() -> Ray:
    """ray, or a ``ConfigError`` that says how to install it."""
    try:
        import ray
    except ImportError:
        raise ConfigError(
            "running on a cluster needs Ray: pip install nbddp[ray] (the same version as "
            "the cluster's)"
        ) from None
    return ray


_connected: str | None = None  # the address this process is a driver of


def connect(cluster: RayCluster) -> Ray:
    """Be a driver of ``cluster``; ray."""
    global _connected
    ray = import_ray()
    if ray.is_initialized() and _connected == cluster.address:
        return ray
    # Before leaving the cluster this process drives: a wrong address changes nothing.
    problem = probe(cluster.ray_address)
    if problem is not None:
        raise ConfigError(
            f"cannot reach the Ray cluster at {cluster.address}: {problem}; check the "
            "address and that the cluster is up (ray status on its head node)"
        )
    if ray.is_initialized():
        release_agents(everything=True)
        ray.shutdown()
    # Why: a killed notebook's ranks must go within seconds, not Ray Client's 30 s.
    os.environ.setdefault("RAY_CLIENT_RECONNECT_GRACE_PERIOD", CLIENT_GRACE)
    try:
        _init(ray, cluster)
    except Exception as exc:
        raise ConfigError(
            f"cannot connect to the Ray cluster at {cluster.address} "
            f"({type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''}); "
            "check the address and that the cluster is up (ray status)"
        ) from exc
    _connected = cluster.address
    return ray


def _init(ray: Ray, cluster: RayCluster) -> None:
    """``ray.init`` for ``cluster``, tried again when Ray Client's server could not
    start this connection's server (``CLIENT_START_TRIES``)."""
    for attempt in range(1, CLIENT_START_TRIES + 1):
        try:
            ray.init(
                address=cluster.ray_address,
                runtime_env=dict(cluster.runtime_env) if cluster.runtime_env else None,
                log_to_driver=False,  # the ranks' output comes through nbddp, not Ray's logs
                logging_level=logging.WARNING,
            )
            return
        except ConnectionAbortedError as exc:
            # The proxy's two ways of failing to start this connection's server;
            # anything else it says (a version mismatch) stands.
            retry = any(s in str(exc) for s in ("client server failed", "Proxy failed to Connect"))
            if not retry or attempt == CLIENT_START_TRIES:
                raise
            with contextlib.suppress(Exception):
                ray.shutdown()


class RayChannel:
    """An agent's actor handle, as a ``Channel``."""

    def __init__(self, handle: Ray) -> None:
        self.handle = handle

    def call(self, method: str, *args: object) -> _Call:
        return _Call(getattr(self.handle, method).remote(*args))


class _Call:
    """A Ray object ref, as a ``Pending``."""

    def __init__(self, ref: Ray) -> None:
        self.ref = ref

    def result(self, timeout: float) -> object:
        """``ray.get``, raising what the agent raised itself (a busy port, a worker that
        could not start) rather than Ray's wrapper of it."""
        ray = import_ray()
        try:
            return ray.get(self.ref, timeout=timeout)
        except ray.exceptions.RayTaskError as exc:
            if isinstance(exc.cause, Exception):
                raise exc.cause from None
            raise


class RayEngine(Engine):
    """Ray's side of ``agents.Engine``."""

    def share(self, value: object) -> object:
        return import_ray().put(value)  # once: each node fetches it once, whatever its ranks

    def connected(self) -> bool:
        return bool(import_ray().is_initialized())

    def give_back(self, hold: object, channels: list[Channel]) -> None:
        ray = import_ray()
        with contextlib.suppress(Exception):
            for channel in channels:
                if isinstance(channel, RayChannel):
                    ray.kill(channel.handle)
            ray.util.remove_placement_group(hold)

    def others_waiting(self, holds: list[object]) -> bool:
        """A pending placement group not one of ``holds``, or (connected directly, not over
        Ray Client) a task or actor waiting."""
        groups: list[Ray] = holds
        ours = {str(g.id.hex()) for g in groups}
        ray = import_ray()
        try:
            for group, entry in ray.util.placement_group_table().items():
                if entry.get("state") == "PENDING" and group not in ours:
                    return True
            if ray.util.client.ray.is_connected():
                return False
            from ray.autoscaler.v2.sdk import get_cluster_status

            status = get_cluster_status(ray.get_runtime_context().gcs_address)
            return bool(status.resource_demands.ray_task_actor_demand)
        except Exception as exc:  # a look that fails says nothing: keep the agents for now
            log.debug("nbddp: could not read the cluster's pending demand: %s", exc)
            return False


def place(config: LaunchConfig) -> Agents:
    assert isinstance(config.cluster, RayCluster)
    ray = connect(config.cluster)
    gpus = config.job.world_size // config.nodes if config.job.device == "cuda" else 0
    shape: Shape = (config.cluster.address, config.nodes, gpus, 1)
    if (kept := reuse(shape)) is not None:
        return kept
    _check_fits(ray, config, gpus)
    return keep(_new_agents(ray, shape))


def _fitting(ray: Ray, gpus: int) -> list[str]:
    """The ids of the live nodes with ``gpus`` GPUs and a CPU."""
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    return [n["NodeID"] for n in nodes if _has(n, "GPU") >= gpus and _has(n, "CPU") >= 1]


def _check_fits(ray: Ray, config: LaunchConfig, gpus: int) -> None:
    fit, count = _fitting(ray, gpus), config.nodes
    if len(fit) >= count:
        return
    held.say_gone(fit, count, "the cluster")  # a node of this notebook's is gone: that first
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    per_node = ("gpus", gpus) if gpus else ("procs", config.job.world_size // count)
    has = ", ".join(
        f"{n['NodeManagerAddress']} ({_has(n, 'GPU'):g} GPUs, {_has(n, 'CPU'):g} CPUs)"
        for n in nodes
    )
    need = f"{gpus} GPUs and a CPU" if gpus else "a CPU"
    raise OptionError(
        "nodes",
        count,
        lambda s: (
            f"{s.given('nodes', count)} with {s.given(*per_node)} needs {count} nodes "
            f"with {need} each, but the cluster has {len(fit)} such node{'s' * (len(fit) != 1)}: "
            f"{has or 'no live node'}; ask for fewer nodes or GPUs"
        ),
    )


def _has(node: Ray, resource: str) -> float:
    return float(node.get("Resources", {}).get(resource, 0.0))


def _new_agents(ray: Ray, shape: Shape) -> Agents:
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    _, nodes, gpus, cpus = shape
    bundle = {"CPU": float(cpus), **({"GPU": float(gpus)} if gpus else {})}
    group = placement_group([bundle] * nodes, strategy="STRICT_SPREAD")
    try:
        placed = group.ready()
        held.wait_placed(
            lambda seconds: bool(ray.wait([placed], timeout=seconds)[0]),
            lambda: _fitting(ray, gpus),
            nodes,
            PLACE_TIMEOUT,
            "the cluster",
        )
        actor = ray.remote(RayNodeAgent)
        handles = [
            actor.options(
                num_cpus=cpus,
                num_gpus=gpus,
                max_concurrency=AGENT_CONCURRENCY,
                scheduling_strategy=PlacementGroupSchedulingStrategy(group, i),
            ).remote()
            for i in range(nodes)
        ]
        infos: list[NodeInfo] = ray.get([h.describe.remote() for h in handles])
        for info in infos:
            where = f"{info.address} ({info.hostname})"
            if problem := mismatch(local_versions(), info.versions, where):
                raise ConfigError(problem)
    except BaseException:
        remove_placement_group(group)
        raise
    order = _node_order(ray, infos)
    channels: list[Channel] = [RayChannel(handles[i]) for i in order]
    return Agents(shape, RayEngine(), group, channels, [infos[i] for i in order])


def _node_order(ray: Ray, infos: list[NodeInfo]) -> list[int]:
    """Indexes of ``infos`` in node-rank order: the head node first, then by address."""
    heads: set[str] = set()
    with contextlib.suppress(Exception):
        heads = {
            str(n.get("NodeID"))
            for n in ray.nodes()
            if "node:__internal_head__" in n.get("Resources", {})
        }

    def key(i: int) -> tuple[bool, tuple[int, ...] | str, int]:
        info = infos[i]
        try:
            address: tuple[int, ...] | str = tuple(socket.inet_aton(info.address))
        except OSError:
            address = info.address
        return (info.node_id not in heads, address, i)

    return sorted(range(len(infos)), key=key)
