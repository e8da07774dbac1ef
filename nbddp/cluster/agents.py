"""The agents a notebook holds on a cluster, whatever engine placed them.

Contract: an engine (``ray_engine``) supplies only placement and a channel: ``Agents(shape, engine,
hold, channels, infos)``, one agent per node in node-rank order, each reached through a ``Channel``,
with the engine's hold on the nodes (``hold``) given back through ``engine.give_back``. Everything
else is here and engine-neutral: agents serve any number of runs at once (``attach``); one follower
thread per agent takes its long poll from placement until release and hands each run its batches on
the relay loop; an agent that does not answer ends every run attached as a lost node
(``Listener.node_lost``) and the set is not used again. Placement waits in ``wait_placed``, which
reads the cluster's nodes again as it waits: a node gone (named when its agent was lost) is said at
once with what is left, not after the timeout. Kept sets no run uses are handed back
``NBDDP_CLUSTER_IDLE`` seconds after their last run, when another job waits for the engine's
resources, on ``release_agents()``, and with the process.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Protocol

from nbddp.agent.node import Batch, NodeInfo
from nbddp.agent.portable import land
from nbddp.errors import ConfigError
from nbddp.launcher import settings
from nbddp.launcher.relay import loop

log = logging.getLogger(__name__)

POLL_WAIT = 1.0  # seconds an agent's long poll waits when nothing happens
LOST_AFTER = 10.0  # seconds beyond POLL_WAIT without an answer before a node counts as lost
KEEP_TICK = 1.0  # seconds between the keeper's looks at idle agents
LOOK_EVERY = 1.0  # seconds between looks at the cluster's nodes while placement waits
PING_TIMEOUT = 5.0  # seconds a kept set's agents get to answer before new ones are placed

Shape = tuple[str, int, int, int]
"""(cluster address, nodes, GPUs per node, CPUs per node): what agents were placed for."""


class Pending(Protocol):
    """A call on its way to an agent."""

    def result(self, timeout: float) -> object:
        """Its value, or what the agent raised; ``TimeoutError``-like after ``timeout``."""


class Channel(Protocol):
    """One agent, as the notebook reaches it."""

    def call(self, method: str, *args: object) -> Pending:
        """Call the agent's ``method`` with ``args`` (raises when the agent is gone)."""


class Engine(Protocol):
    """What places agents: the only engine-specific part besides each ``Channel``. An
    engine that subclasses it gets the defaults: an engine of its own nodes."""

    def share(self, value: object) -> object:
        """What to pass to every agent for ``value`` so it travels to each node once."""
        return value

    def connected(self) -> bool:
        """False once this process has left the cluster (its agents went with it)."""
        return True

    def give_back(self, hold: object, channels: list[Channel]) -> None:
        """End the agents and give their nodes back."""

    def others_waiting(self, holds: list[object]) -> bool:
        """Whether another job waits for the cluster's resources (not ``holds``)."""
        return False

    def note(self) -> str:
        """What else ``describe`` says of these agents (a Slurm job's time left)."""
        return ""


class Listener(Protocol):
    """A run attached to a set of agents (``client.ClusterJob``)."""

    def take(self, node: int, batch: Batch) -> None:
        """Node ``node``'s agent sent this run ``batch`` (the relay loop's thread)."""

    def node_lost(self, node: int, exc: BaseException) -> None:
        """Node ``node``'s agent no longer answers (the relay loop's thread)."""


@dataclass
class Agents:
    """A set of agents, one per node, in node-rank order."""

    shape: Shape
    engine: Engine
    hold: object
    """The engine's hold on the nodes (a Ray placement group)."""
    channels: list[Channel]
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
        _keeper_wake.set()

    def in_use(self) -> bool:
        with self._lock:
            return bool(self.runs)

    def follow(self) -> None:
        """Start following every agent's long poll (one thread each)."""
        for index in range(len(self.channels)):
            threading.Thread(
                target=self._follow, args=(index,), name=f"nbddp-node{index}", daemon=True
            ).start()

    def _follow(self, index: int) -> None:
        channel = self.channels[index]
        while not self.released:
            if not self.engine.connected():  # left the cluster: the agents went with it
                self.released = True
                return
            try:
                polled = channel.call("poll", POLL_WAIT).result(POLL_WAIT + LOST_AFTER)
            except Exception as exc:  # the agent or its node is gone
                if not self.released and self.engine.connected():
                    self._lost(index, exc)
                return
            assert isinstance(polled, tuple)
            batches = land(polled)
            assert isinstance(batches, dict)
            for run, batch in batches.items():
                with self._lock:
                    listener = self.runs.get(run)
                if listener is not None:
                    loop().call(listener.take, index, batch)

    def _lost(self, index: int, exc: BaseException) -> None:
        log.warning("nbddp: node %d's agent is lost: %s", index, exc)
        self.broken = True
        info, same = self.infos[index], len({i.address for i in self.infos}) < len(self.infos)
        _lost_nodes[info.node_id] = f"node {index} ({info.hostname if same else info.address})"
        with self._lock:
            listeners = list(self.runs.values())
        for listener in listeners:
            loop().call(listener.node_lost, index, exc)
        _keeper_wake.set()

    def release(self) -> None:
        """Hand the agents and their nodes back (their ranks go with them)."""
        if not self.released:
            self.released = True
            self.engine.give_back(self.hold, self.channels)


_sets: list[Agents] = []  # every set not yet released, newest last
_sets_lock = threading.Lock()
_lost_nodes: dict[str, str] = {}  # node id -> name: agents lost since the last placement


def reuse(shape: Shape) -> Agents | None:
    """A kept set of ``shape`` whose agents all answer (sets that do not answer are marked
    broken); else None, once the sets no run uses are handed back: what they hold may be
    what new agents need."""
    with _sets_lock:
        candidates = [s for s in reversed(_sets) if s.shape == shape and not s.broken]
    for agents in candidates:
        if _answers(agents):
            return agents
        agents.broken = True
    release_agents()
    return None


def _answers(agents: Agents) -> bool:
    """Every agent answers ``describe`` within ``PING_TIMEOUT`` (all asked at once)."""
    with contextlib.suppress(Exception):
        deadline = time.monotonic() + PING_TIMEOUT
        for ping in [c.call("describe") for c in agents.channels]:
            ping.result(max(0.0, deadline - time.monotonic()))
        return not agents.broken
    return False


def keep(agents: Agents) -> Agents:
    """Hold ``agents`` for later runs: follow their polls, hand them back when idle."""
    with _sets_lock:
        _sets.append(agents)
        _lost_nodes.clear()  # placed anew: nodes lost before are not this run's story
    agents.follow()
    _start_keeper()
    return agents


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


def say_gone(fit: Collection[str], asked: int, where: str) -> None:
    """Raise ``ConfigError`` if fewer than ``asked`` nodes fit a run (``fit``: their ids)
    and nodes whose agent was lost are not among them, naming those and what is left."""
    gone = [name for node, name in _lost_nodes.copy().items() if node not in fit]  # threads add
    if gone and len(fit) < asked:
        left = f"{len(fit)} node{'s' * (len(fit) != 1)} that fit{'s' * (len(fit) == 1)}"
        are = "is" if len(gone) == 1 else "are"
        raise ConfigError(
            f"nbddp: {', '.join(gone)} {are} gone; {where} has {left} this run, {asked} asked for"
        )


def wait_placed(
    ready: Callable[[float], bool],
    fitting: Callable[[], Collection[str]],
    asked: int,
    timeout: float,
    where: str,
) -> None:
    """Return once ``ready(seconds)`` (a wait of at most that long) is true, reading the ids
    of ``where``'s nodes that fit the run (``fitting()``) between waits: fewer than
    ``asked`` raise ``ConfigError`` at once (``say_gone``), as ``timeout`` does."""
    deadline = time.monotonic() + timeout
    while not ready(LOOK_EVERY):
        fit = fitting()
        if len(fit) < asked:
            say_gone(fit, asked, where)
            raise ConfigError(f"{where} has {len(fit)} of the {asked} nodes this run needs now")
        if time.monotonic() >= deadline:
            raise ConfigError(
                f"{where} has {len(fit)} nodes that fit this run, but their resources did not "
                f"come free within {timeout:g}s ({_holders()}); retry later"
            )


def _holders() -> str:
    """Who holds the resources this process waited for, as far as it knows."""
    mine = [s for s in kept() if s.in_use()]
    if not mine:
        return "other jobs hold them"
    runs, sessions = sum(len(s.runs) for s in mine), sum(len(s.sessions) for s in mine)
    return (
        f"other jobs, or this notebook's {runs} running run(s) on other agents "
        f"({sessions} of them sessions), hold them"
    )


def describe() -> str:
    """What this notebook holds on its cluster, in a few lines."""
    sets = kept()
    if not sets:
        return "no agents held on any cluster"
    idle = settings.read().cluster_idle
    lines = []
    for agents in sets:
        address, count, gpus, _ = agents.shape
        nodes = ", ".join(
            f"node {i} {info.hostname} ({info.address})" for i, info in enumerate(agents.infos)
        )
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
        use += f"; {note}" if (note := agents.engine.note()) else ""
        lines.append(f"{address}: {count} agents ({what}) on {nodes}; {use}")
    return "\n".join(lines)


# -- handing idle agents back -------------------------------------------------------

_keeper: threading.Thread | None = None
_keeper_wake = threading.Event()
_ending = False


def _start_keeper() -> None:
    global _keeper
    with _sets_lock:
        if _keeper is not None and _keeper.is_alive():
            return
        if _keeper is None:
            # Registered after the engine connected (ray.init), so it runs before the
            # engine's own exit handler: nothing calls an engine that has shut down (Ray's
            # core worker then ends the process with status 1).
            atexit.register(_stop_following)
        _keeper = threading.Thread(target=_keep, name="nbddp-cluster-keeper", daemon=True)
        _keeper.start()


def _stop_following() -> None:
    """This process is ending: the engine ends its agents; the keeper and the followers
    make no new call and are waited for while their call in flight ends."""
    global _ending
    _ending = True
    _keeper_wake.set()
    for agents in kept():
        agents.released = True
    deadline = time.monotonic() + POLL_WAIT + 1
    for thread in threading.enumerate():
        if thread.name.startswith(("nbddp-node", "nbddp-cluster-keeper")):
            thread.join(max(0.0, deadline - time.monotonic()))


def _keep() -> None:
    """Hand back idle agents when their time is up or another job waits (module contract)."""
    while True:
        _keeper_wake.wait(KEEP_TICK)
        _keeper_wake.clear()
        sets = kept()
        if not sets or _ending:
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
        if len(due) < len(idle) and idle[0].engine.others_waiting([s.hold for s in sets]):
            due = idle
        for agents in due:
            with _sets_lock:
                if agents not in _sets or agents.in_use():
                    continue
                _sets.remove(agents)
            log.info("nbddp: handing back idle agents of %s", agents.shape[0])
            agents.release()
