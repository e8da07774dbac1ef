"""Connecting to a Ray cluster and placing one agent per node: the only module that
starts Ray things.

Contract: ``import_ray()`` imports ray or raises ``ConfigError`` saying to
``pip install nbddp[ray]``. ``connect(cluster)`` makes this process a driver of
``cluster`` (reusing the connection when it is the same cluster), after a quick
TCP check so that an unreachable address fails in seconds with one line.
``place(config)`` returns the run's ``Agents``: one ``agent.NodeAgent`` per
node, in a placement group of one bundle per node (the node's GPUs, or a CPU
for CPU ranks; strict spread), each checked to run the notebook's versions.
Before placing, the cluster's nodes are compared with what the run asks, and
a cluster too small is named in one line with what it has. The agents are
kept for the next launch of the same shape (a warm launch: their forkservers
and pools are already up); another shape, ``release_agents()`` or the end of
this process hands them back. The agents are owned by this driver: Ray ends
them, and with them every rank, when this process goes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from dataclasses import dataclass
from typing import Any

from nbddp.cluster.agent import NodeAgent, NodeInfo
from nbddp.cluster.versions import local_versions, mismatch
from nbddp.errors import ConfigError
from nbddp.launcher.config import LaunchConfig
from nbddp.launcher.raycluster import RayCluster
from nbddp.launcher.spelling import OptionError

CONNECT_CHECK = 5.0  # seconds the address gets to accept a TCP connection
PLACE_TIMEOUT = 60.0  # seconds the placement group and the agents get to be ready
PING_TIMEOUT = 5.0  # seconds a kept agent gets to answer before new ones are placed
AGENT_CONCURRENCY = 16  # an agent's threads: a long poll never holds up a stop
CLIENT_GRACE = "2"  # seconds Ray Client waits for a lost notebook (its default: 30)
CLIENT_START_TRIES = 3
"""Connections tried when Ray Client's server fails to start the notebook's own server
process: its proxy forks that process from a gRPC-threaded one, and the child
sometimes exits at once with nothing in its logs ("Starting Ray client server
failed"; seen on this project's 2-core CI machine about one first connection in
several); the proxy starts a fresh one for each new connection."""

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
    """Be a driver of ``cluster``; ray (see module contract)."""
    global _connected
    ray = import_ray()
    if ray.is_initialized() and _connected == cluster.address:
        return ray
    if ray.is_initialized():
        release_agents()
        ray.shutdown()
    _reachable(cluster)
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
            if "client server failed" not in str(exc) or attempt == CLIENT_START_TRIES:
                raise
            with contextlib.suppress(Exception):
                ray.shutdown()


def _reachable(cluster: RayCluster) -> None:
    """Fail in seconds, with one line, when the address does not answer."""
    address = cluster.ray_address
    if address == "auto":
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=CONNECT_CHECK):
            pass
    except (OSError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(
            f"cannot reach the Ray cluster at {cluster.address} ({why}); "
            "check the address and that the cluster is up (ray status on its head node)"
        ) from None


@dataclass
class Agents:
    """A run's agents, one per node, in node-rank order."""

    shape: tuple[str, int, int, int]
    """(cluster address, nodes, GPUs per node, CPUs per node): what they were placed for."""
    group: Ray
    handles: list[Ray]
    infos: list[NodeInfo]


_kept: Agents | None = None


def place(config: LaunchConfig) -> Agents:
    """The run's agents, kept or new (see module contract)."""
    global _kept
    assert config.cluster is not None
    ray = connect(config.cluster)
    per = config.job.world_size // config.nodes
    gpus = per if config.job.device == "cuda" else 0
    shape = (config.cluster.address, config.nodes, gpus, 1)
    if _kept is not None and _kept.shape == shape and _alive(ray, _kept):
        return _kept
    release_agents()
    _check_fits(ray, config, gpus)
    _kept = _new_agents(ray, shape)
    return _kept


def _alive(ray: Ray, agents: Agents) -> bool:
    """Every kept agent still answers (one round trip each, in parallel)."""
    with contextlib.suppress(Exception):
        pings = [h.__ray_ready__.remote() for h in agents.handles]
        ready, _ = ray.wait(pings, num_returns=len(pings), timeout=PING_TIMEOUT)
        if len(ready) == len(pings):
            ray.get(ready)  # raises for an agent that died
            return True
    return False


def _check_fits(ray: Ray, config: LaunchConfig, gpus: int) -> None:
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    fit = [n for n in nodes if _has(n, "GPU") >= gpus and _has(n, "CPU") >= 1]
    if len(fit) >= config.nodes:
        return
    count = config.nodes
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


def _new_agents(ray: Ray, shape: tuple[str, int, int, int]) -> Agents:
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    _, nodes, gpus, cpus = shape
    bundle = {"CPU": float(cpus), **({"GPU": float(gpus)} if gpus else {})}
    group = placement_group([bundle] * nodes, strategy="STRICT_SPREAD")
    try:
        ready, _ = ray.wait([group.ready()], timeout=PLACE_TIMEOUT)
        if not ready:
            raise ConfigError(
                f"the cluster has {nodes} nodes that fit this run, but their resources did not "
                f"come free within {PLACE_TIMEOUT:g}s (other jobs hold them); retry later"
            )
        actor = ray.remote(NodeAgent)
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
        ours = local_versions()
        for info in infos:
            problem = mismatch(ours, info.versions, f"{info.address} ({info.hostname})")
            if problem:
                raise ConfigError(problem)
    except BaseException:
        remove_placement_group(group)
        raise
    return Agents(shape, group, handles, infos)


def release_agents() -> None:
    """Hand back the kept agents and their placement group (their ranks go with them)."""
    global _kept
    agents, _kept = _kept, None
    if agents is None:
        return
    ray = import_ray()
    from ray.util.placement_group import remove_placement_group

    with contextlib.suppress(Exception):
        for handle in agents.handles:
            ray.kill(handle)
        remove_placement_group(agents.group)


def forget(agents: Agents) -> None:
    """Do not keep ``agents`` for the next launch (one of them was lost)."""
    global _kept
    if _kept is agents:
        release_agents()
