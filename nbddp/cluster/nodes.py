"""Connecting to a Ray cluster and placing one agent per node: the only module that
starts Ray things.

Contract: ``import_ray()`` imports ray or raises ``ConfigError`` saying to
``pip install nbddp[ray]``. ``connect(cluster)`` makes this process a driver of
``cluster`` (reusing the connection when it is the same cluster), after a
probe (``probe``) so that a wrong or silent address fails in seconds with one
line. ``place(config)`` returns agents for a run: one ``agent.NodeAgent`` per
node, in a placement group of one bundle per node (the node's GPUs, or a CPU
for CPU ranks; strict spread), each checked to run the notebook's versions,
ordered so that node 0 (the store's host, ``MASTER_ADDR``) is the head node
when it is one of them, then by address. Before placing, the cluster's nodes
are compared with what the run asks, and a cluster too small is named in one
line with what it has.

Sharing: agents serve any number of runs at once (``Agents.attach``, each with
its own job and store on every node). A launch of the same shape takes the
agents kept from earlier runs (a warm launch: their forkservers and pools are
up), whether or not they are busy; another shape gets agents of its own, and
kept agents no run uses are handed back then. Kept agents no run uses are
also handed back ``NBDDP_CLUSTER_IDLE`` seconds after their last run ended,
and within about a second when another driver's demand for resources is
pending on the cluster (a placement group, a task or an actor waiting): the
cluster is shared, and a warm start is worth less than another user's wait.
A live session is a run: its agents stay. ``release_agents()`` hands back
every set no run uses; the end of this process hands back all (Ray ends a
driver's actors with it, and every rank with them).

Contact: each set's ``Link`` follows every agent's long poll, from placement
until release, between runs too (an agent ends itself when its polls stop:
``agent.QUIET``), and hands each run its batches. An agent that does not
answer ends every run attached as a lost node (``Listener.node_lost``) and the set
is not used again.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from nbddp.cluster.agent import Batch, NodeAgent, NodeInfo
from nbddp.cluster.probe import probe
from nbddp.cluster.versions import local_versions, mismatch
from nbddp.errors import ConfigError
from nbddp.launcher import settings
from nbddp.launcher.config import LaunchConfig
from nbddp.launcher.raycluster import RayCluster
from nbddp.launcher.spelling import OptionError

log = logging.getLogger(__name__)

PLACE_TIMEOUT = 60.0  # seconds the placement group and the agents get to be ready
PING_TIMEOUT = 5.0  # seconds a kept agent gets to answer before new ones are placed
AGENT_CONCURRENCY = 32  # an agent's threads: a long poll never holds up a stop
CLIENT_GRACE = "2"  # seconds Ray Client waits for a lost notebook (its default: 30)
POLL_WAIT = 1.0  # seconds an agent's long poll waits when nothing happens
LOST_AFTER = 10.0  # seconds beyond POLL_WAIT without an answer before a node counts as lost
KEEP_TICK = 1.0  # seconds between the keeper's looks at idle agents
CLIENT_START_TRIES = 3
"""Connections tried when Ray Client's server fails to start the notebook's own server
process: its proxy forks that process from a gRPC-threaded one, and the child
sometimes exits at once with nothing in its logs ("Starting Ray client server
failed", or the proxy finding no channel to it: "Proxy failed to Connect to backend";
seen on this project's 2-core CI machine about one first connection in several);
the proxy starts a fresh one for each new connection."""

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
            text = str(exc)
            # The proxy's two ways of failing to start this connection's server;
            # anything else it says (a version mismatch) stands.
            retry = "client server failed" in text or "Proxy failed to Connect" in text
            if not retry or attempt == CLIENT_START_TRIES:
                raise
            with contextlib.suppress(Exception):
                ray.shutdown()


class Listener(Protocol):
    """A run attached to a set of agents (``client.ClusterJob``)."""

    def take(self, node: int, batch: Batch) -> None:
        """Node ``node``'s agent sent this run ``batch`` (a follower thread)."""

    def node_lost(self, node: int, exc: BaseException) -> None:
        """Node ``node``'s agent no longer answers (a follower thread)."""


Shape = tuple[str, int, int, int]
"""(cluster address, nodes, GPUs per node, CPUs per node): what agents were placed for."""


@dataclass
class Agents:
    """A set of agents, one per node, in node-rank order (see module contract)."""

    shape: Shape
    group: Ray
    handles: list[Ray]
    infos: list[NodeInfo]
    runs: dict[str, Listener] = field(default_factory=dict)
    """The runs attached, by run id."""
    broken: bool = False
    """An agent was lost: no new run is placed on this set."""
    released: bool = False
    idle_since: float = field(default_factory=time.monotonic)
    sessions: set[str] = field(default_factory=set)
    """The attached runs that are sessions (``describe``)."""
    served: int = 0
    """Runs attached so far."""
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def attach(self, run: str, listener: Listener, *, session: bool = False) -> bool:
        """Hand ``run`` its batches from now on; True for the set's first run."""
        with self._lock:
            self.runs[run] = listener
            if session:
                self.sessions.add(run)
            self.served += 1
            return self.served == 1

    def detach(self, run: str) -> None:
        """``run`` has ended: its batches are not wanted any more."""
        with self._lock:
            self.runs.pop(run, None)
            self.sessions.discard(run)
            if not self.runs:
                self.idle_since = time.monotonic()
        _wake_keeper()

    def in_use(self) -> bool:
        with self._lock:
            return bool(self.runs)

    def follow(self) -> None:
        """Start following every agent's long poll (one thread each)."""
        for index in range(len(self.handles)):
            threading.Thread(
                target=self._follow, args=(index,), name=f"nbddp-node{index}", daemon=True
            ).start()

    def _follow(self, index: int) -> None:
        ray = import_ray()
        handle = self.handles[index]
        while not self.released:
            if not ray.is_initialized():  # ray.shutdown(): the agents went with it
                self.released = True
                return
            try:
                polled: dict[str, Batch] = ray.get(
                    handle.poll.remote(POLL_WAIT), timeout=POLL_WAIT + LOST_AFTER
                )
            except Exception as exc:  # the agent or its node is gone
                if not self.released and ray.is_initialized():
                    self._lost(index, exc)
                return
            for run, batch in polled.items():
                with self._lock:
                    listener = self.runs.get(run)
                if listener is not None:
                    listener.take(index, batch)

    def _lost(self, index: int, exc: BaseException) -> None:
        log.warning("nbddp: node %d's agent is lost: %s", index, exc)
        self.broken = True
        with self._lock:
            listeners = list(self.runs.values())
        for listener in listeners:
            listener.node_lost(index, exc)
        _wake_keeper()

    def release(self) -> None:
        """Hand the agents and their placement group back (their ranks go with them)."""
        if self.released:
            return
        self.released = True
        ray = import_ray()
        from ray.util.placement_group import remove_placement_group

        with contextlib.suppress(Exception):
            for handle in self.handles:
                ray.kill(handle)
            remove_placement_group(self.group)


_sets: list[Agents] = []  # every set not yet released, newest last
_sets_lock = threading.Lock()


def place(config: LaunchConfig) -> Agents:
    """Agents for the run (see module contract)."""
    assert config.cluster is not None
    ray = connect(config.cluster)
    per = config.job.world_size // config.nodes
    gpus = per if config.job.device == "cuda" else 0
    shape: Shape = (config.cluster.address, config.nodes, gpus, 1)
    with _sets_lock:
        candidates = [s for s in reversed(_sets) if s.shape == shape and not s.broken]
    for agents in candidates:
        if _alive(ray, agents):
            return agents
        agents.broken = True
    release_agents()  # what no run uses: its resources may be what this run needs
    _check_fits(ray, config, gpus)
    agents = _new_agents(ray, shape)
    with _sets_lock:
        _sets.append(agents)
    agents.follow()
    _start_keeper()
    return agents


def _alive(ray: Ray, agents: Agents) -> bool:
    """Every agent still answers (one round trip each, in parallel)."""
    with contextlib.suppress(Exception):
        pings = [h.__ray_ready__.remote() for h in agents.handles]
        ready, _ = ray.wait(pings, num_returns=len(pings), timeout=PING_TIMEOUT)
        if len(ready) == len(pings):
            ray.get(ready)  # raises for an agent that died
            return not agents.broken
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


def _new_agents(ray: Ray, shape: Shape) -> Agents:
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
                f"come free within {PLACE_TIMEOUT:g}s ({_holders()}); retry later"
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
    order = _node_order(ray, infos)
    return Agents(shape, group, [handles[i] for i in order], [infos[i] for i in order])


def _holders() -> str:
    """Who holds the resources this process waited for, as far as it knows."""
    with _sets_lock:
        mine = [s for s in _sets if s.in_use()]
    if not mine:
        return "other jobs hold them"
    runs = sum(len(s.runs) for s in mine)
    sessions = sum(len(s.sessions) for s in mine)
    return (
        f"other jobs, or this notebook's {runs} running run(s) on other agents "
        f"({sessions} of them sessions), hold them"
    )


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


def release_agents(*, everything: bool = False) -> None:
    """Hand back every set of agents no run uses (``everything``: all of them, their
    runs' ranks with them)."""
    with _sets_lock:
        going = [s for s in _sets if everything or not s.in_use()]
        for agents in going:
            _sets.remove(agents)
    for agents in going:
        agents.release()


def kept() -> list[Agents]:
    """The sets of agents not yet handed back, oldest first."""
    with _sets_lock:
        return list(_sets)


def describe() -> str:
    """What this notebook holds on its cluster, in a few lines."""
    sets = kept()
    if not sets:
        return "no agents held on any cluster"
    idle = settings.read().cluster_idle
    lines = []
    for agents in sets:
        address, count, gpus, _ = agents.shape
        nodes = ", ".join(f"node {i} {info.address}" for i, info in enumerate(agents.infos))
        what = f"{gpus} GPUs per node" if gpus else "a CPU per node"
        with agents._lock:
            runs, sessions = len(agents.runs), len(agents.sessions)
        if runs:
            use = f"held by {runs} run(s), {sessions} of them session(s)"
        else:
            left = max(0.0, idle - (time.monotonic() - agents.idle_since))
            use = f"idle, handed back in {left:.0f}s or when another job waits for them"
        if agents.broken:
            use += "; a node was lost: handed back once its runs end"
        lines.append(f"{address}: {count} agents ({what}) on {nodes}; {use}")
    return "\n".join(lines)


# -- handing idle agents back -------------------------------------------------------

_keeper: threading.Thread | None = None
_keeper_wake = threading.Event()


def _start_keeper() -> None:
    global _keeper
    with _sets_lock:
        if _keeper is not None and _keeper.is_alive():
            return
        if _keeper is None:
            # Registered after ray.init, so it runs before Ray's own exit handler: the
            # followers stop calling a Ray that is shutting down (its core worker
            # ends the process when called then).
            atexit.register(_stop_following)
        _keeper = threading.Thread(target=_keep, name="nbddp-cluster-keeper", daemon=True)
        _keeper.start()


def _stop_following() -> None:
    """This process is ending: Ray ends its agents; the followers stop now."""
    for agents in kept():
        agents.released = True


def _wake_keeper() -> None:
    _keeper_wake.set()


def _keep() -> None:
    """Hand back idle agents when their time is up or another job waits (module contract)."""
    while True:
        _keeper_wake.wait(KEEP_TICK)
        _keeper_wake.clear()
        sets = kept()
        if not sets:
            return
        idle = [s for s in sets if not s.in_use()]
        if not idle:
            continue
        try:
            limit = settings.read().cluster_idle
        except ConfigError:
            limit = settings.CLUSTER_IDLE.default
        now = time.monotonic()
        due = [s for s in idle if s.broken or now - s.idle_since >= limit]
        if len(due) < len(idle) and _foreign_demand({str(s.group.id.hex()) for s in sets}):
            due = idle
        for agents in due:
            with _sets_lock:
                if agents in _sets and not agents.in_use():
                    _sets.remove(agents)
                else:
                    continue
            log.info("nbddp: handing back idle agents of %s", agents.shape[0])
            agents.release()


def _foreign_demand(ours: set[str]) -> bool:
    """Whether another job waits for cluster resources: a pending placement group not
    ours, or (connected directly, not over Ray Client) a task or actor waiting."""
    ray = import_ray()
    try:
        from ray.util import placement_group_table

        for group, entry in placement_group_table().items():
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
