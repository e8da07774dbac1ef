"""``ClusterJob``: the notebook side of a run across a Ray cluster's nodes.

Contract: ``ClusterJob(config, payload).start()`` takes agents (``nodes.place``:
kept ones of the same shape, busy or not, or new ones), attaches to them under
its own run id, has agent 0 host the run's own rendezvous store on its node
address, ships the call once (``ray.put``; its large CPU tensors as bytes,
landing in shared memory on each node) and starts every node's slice as a
job of its own there. So any number of runs go on at once, each stopped,
timed out and ended on its own. It is a ``launcher.run.RunSource``: ``Run``,
the displays, ``failures.run_error`` and ``%%ddp`` read it exactly as they
read a local ``Job``: typed events on ``events`` (global ranks, ending with
one ``Done``), ``outcomes()``, ``root_cause``, ``status``, ``wait``,
``elapsed``, ``pids`` (each on its own node), ``stop`` and ``dump_stacks``
(sent to every node). ``nodes`` says where each node's ranks run (node 0
hosts the store: ``MASTER_ADDR``), also said in a notice by the first run on
new agents, and in the error of a rank that died (``rank 3 was killed by signal SIGKILL
... on node 1 (10.0.0.2)``).

The agents' ``Link`` hands this run its batches (``take``) from one thread per
node; each rank's output goes to the rank's log here, as the relay does
locally. A failure on any node stops every node after ``failure_grace`` (the
root cause is the earliest by the ranks' own clocks, as locally). A node
whose agent is lost (the node went down, its agent was killed) ends its
ranks as failed: the run is stopped and raises ``RankExitedError`` for the
first of them, with a notice naming the node and all its ranks. The run has
ended once every node's ranks have.

Hooks for a session across nodes (``cluster.session``): ``_route`` (every
event), ``_message`` (a session rank's reply), ``_ending`` (once, before the
last event).
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import IO

from nbddp.cluster import nodes
from nbddp.cluster.agent import Batch
from nbddp.cluster.nodejobs import Reply
from nbddp.cluster.nodes import Ray
from nbddp.cluster.portable import (
    ShippedError,
    ShippedReply,
    land_error,
    land_reply,
    land_value,
    ship_payload,
)
from nbddp.launcher.config import LaunchConfig, NodeSlice
from nbddp.launcher.events import (
    Done,
    Failure,
    InputAsked,
    Notice,
    RankOutcome,
    RankState,
    RunEvent,
    RunStatus,
    StateChanged,
    Text,
    run_status,
)
from nbddp.launcher.failures import describe_exit, local_time, root_cause
from nbddp.launcher.job import PROMPT_RECHECK
from nbddp.launcher.logs import new_run_dir, rank_log
from nbddp.launcher.prompts import WaitClock
from nbddp.wire.payload import Payload
from nbddp.wire.protocol import Body, ErrorInfo

START_TIMEOUT = 120.0  # seconds the nodes get to start their ranks (a first torch import)


def release_agents() -> None:
    """Hand back the agents no run uses (``nbddp.cluster.release``)."""
    nodes.release_agents()


@dataclass(frozen=True)
class NodePlace:
    """Where one node's ranks of a run run."""

    index: int
    """The node rank (``NODE_RANK``); node 0 hosts the store."""
    address: str
    ranks: range
    """The global ranks it runs."""

    def __str__(self) -> str:
        return f"node {self.index} ({self.address})"


@dataclass
class _Node:
    """What the notebook knows of one node's part of the run."""

    place: NodePlace
    handle: Ray
    ended: bool = False
    status: RunStatus | None = None


@dataclass
class _Rank:
    rank: int
    state: RankState = RankState.STARTING
    pid: int | None = None
    started_at: float = field(default_factory=time.monotonic)
    final: RankOutcome | None = None
    stacks: str | None = None


class ClusterJob:
    """One run across a cluster's nodes (see module contract)."""

    SESSION = False
    """Start each node's ranks as a session's (``cluster.session``)."""

    def __init__(self, config: LaunchConfig, payload: Payload) -> None:
        self.config = config
        self.spec = config.job
        self._payload: Payload | None = payload
        self.run_id = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
        self._run_dir = new_run_dir(self.run_id)
        self.log_dir = self._run_dir.path
        self.events: queue.SimpleQueue[RunEvent] = queue.SimpleQueue()
        self._ranks = [_Rank(r) for r in range(config.job.world_size)]
        self._nodes: list[_Node] = []
        self._lock = threading.Lock()  # guards what the node threads change
        self._failures: list[tuple[float, Failure]] = []
        self._errors: dict[int, ErrorInfo] = {}  # landed once per rank
        self._stop_reason: RunStatus | None = None
        self._stop_timer: threading.Timer | None = None
        self._logs: dict[int, IO[bytes]] = {}
        self._done = threading.Event()
        self._started_at = time.monotonic()
        self._ended_at: float | None = None
        self._agents: nodes.Agents | None = None
        self._waits = WaitClock()  # ranks at a prompt (node threads; a session's loop)

    # -- starting ---------------------------------------------------------

    def start(self) -> None:
        """Take agents, host the store, start every node's ranks (caller thread)."""
        payload = self._payload
        if payload is None:
            raise RuntimeError("this job has already run; start a new one")
        shipped = ship_payload(payload)
        agents = self._agents = nodes.place(self.config)
        ray = nodes.import_ray()
        spec, count = self.config.job, self.config.nodes
        per = spec.world_size // count
        for i, (handle, info) in enumerate(zip(agents.handles, agents.infos, strict=True)):
            place = NodePlace(i, info.address, range(i * per, (i + 1) * per))
            self._nodes.append(_Node(place, handle))
        fresh = agents.attach(self.run_id, self, session=self.SESSION)
        try:
            port = _get(
                ray, agents.handles[0].host_store.remote(self.run_id, spec.port), START_TIMEOUT
            )
            ref = ray.put(shipped)  # once: each node fetches it once, whatever its ranks
            master = agents.infos[0].address
            calls = [
                node.handle.start.remote(
                    self.run_id,
                    spec,
                    NodeSlice(i, count, i * per, per, master, port),
                    ref,
                    self.SESSION,
                )
                for i, node in enumerate(self._nodes)
            ]
            pids = _get(ray, calls, START_TIMEOUT)
        except BaseException:
            self._abandon_start()
            raise
        for node_pids in pids:
            for rank, pid in node_pids.items():
                self._ranks[rank].pid = pid
        if fresh:  # where the ranks run, said once per set of agents (``nodes`` says it)
            where = "; ".join(f"{n.place}: {_ranks(list(n.place.ranks))}" for n in self._nodes)
            self._route(Notice(f"on {where}; node 0 hosts the store (MASTER_ADDR)"))

    def _abandon_start(self) -> None:
        """Starting failed part-way: what started goes (its job, or the agents when no
        other run uses them), and the run ends."""
        agents = self._agents
        assert agents is not None
        agents.detach(self.run_id)
        if not agents.in_use():
            agents.broken = True  # whatever started is ended with its agents
            nodes.release_agents()
        else:
            for node in self._nodes:
                with contextlib.suppress(Exception):
                    node.handle.stop.remote(self.run_id, RunStatus.FAILED)
        for record in self._ranks:
            record.state = RankState.STOPPED
        for node in self._nodes:
            node.ended = True
        self._finish()

    @property
    def nodes(self) -> tuple[NodePlace, ...]:
        """Where each node's ranks run, by node rank."""
        return tuple(n.place for n in self._nodes)

    def node_of(self, rank: int) -> NodePlace:
        """The node global ``rank`` runs on."""
        return next(n.place for n in self._nodes if rank in n.place.ranks)

    # -- RunSource ----------------------------------------------------------

    def stop(self, reason: RunStatus = RunStatus.STOPPED) -> None:
        """Stop every rank on every node (any thread)."""
        with self._lock:
            if self._stop_reason is None:
                self._stop_reason = reason
            live = [n for n in self._nodes if not n.ended]
        for node in live:
            with contextlib.suppress(Exception):
                node.handle.stop.remote(self.run_id, reason)

    def dump_stacks(self) -> None:
        """Have every running rank on every node write its stacks into its output."""
        for node in self._nodes:
            if not node.ended:
                with contextlib.suppress(Exception):
                    node.handle.dump_stacks.remote(self.run_id)

    def answer(self, rank: int, number: int, text: str | None) -> None:
        """Send ``rank`` (global) the user's line for its prompt, through its node's agent."""
        for node in self._nodes:
            if rank in node.place.ranks and not node.ended:
                with contextlib.suppress(Exception):
                    node.handle.answer.remote(self.run_id, rank, number, text)

    def pids(self) -> dict[int, int]:
        """Global rank -> pid on its node."""
        return {r.rank: r.pid for r in self._ranks if r.pid is not None}

    def wait(self, timeout: float | None = None) -> bool:
        """True once every node's ranks have ended and all their output has arrived."""
        return self._done.wait(timeout)

    def outcomes(self) -> tuple[RankOutcome, ...]:
        """Each rank as last seen; final once ``wait`` returns True."""
        with self._lock:
            return tuple(r.final or _running(r) for r in self._ranks)

    def failures(self) -> list[tuple[float, Failure]]:
        """Every rank failure so far as ``(time.monotonic(), failure)``, in arrival order."""
        with self._lock:
            return list(self._failures)

    @property
    def root_cause(self) -> Failure | None:
        """The earliest failure on any node (``failures.root_cause``)."""
        with self._lock:
            return root_cause(list(self._failures), self.config.job.failure_grace)

    @property
    def stop_reason(self) -> RunStatus | None:
        """Why the ranks are being (or were) stopped; None while nothing stops them."""
        return self._stop_reason

    @property
    def status(self) -> RunStatus:
        """Where the run is; once it has ended, how it ended."""
        ended = self._done.is_set()
        reason = self._stop_reason or (
            _node_reason([n.status for n in self._nodes]) if ended else None
        )
        failed = ended and self.root_cause is not None
        return run_status(ended, (r.state for r in self._ranks), reason, failed)

    def elapsed(self) -> float:
        """Seconds from the start until the run ended (or until now)."""
        return (self._ended_at or time.monotonic()) - self._started_at

    # -- what the agents send (``nodes.Listener``: one thread per node) ----------

    def take(self, index: int, batch: Batch) -> None:
        """Node ``index``'s agent sent this run ``batch``."""
        node = self._nodes[index]
        if node.ended:
            return
        for event in batch.events:
            if isinstance(event, Reply):
                self._reply(event)
                continue
            if isinstance(event, Text):
                self._log(event.rank, event.text)
            elif isinstance(event, StateChanged):
                self._ranks[event.rank].state = event.state
                if event.state is not RankState.WAITING:
                    self._waits.end(event.rank)
            elif isinstance(event, InputAsked):
                self._waits.begin(event.rank)
            self._route(event)
        if batch.failures:
            with self._lock:
                for shipped in batch.failures:
                    error = self._land(shipped.failure.rank, shipped.error)
                    failure = replace(shipped.failure, error=error)
                    self._failures.append((local_time(shipped.at) or time.monotonic(), failure))
            self._schedule_stop()
        if batch.outcomes is not None:
            self._close_node(node, batch)
            self._node_ended(node)

    def node_lost(self, index: int, exc: BaseException) -> None:
        """Node ``index``'s agent is gone: its ranks ended with it (module contract)."""
        node = self._nodes[index]
        if node.ended:
            return
        now = time.monotonic()
        ranks = [r for r in node.place.ranks if self._ranks[r].final is None]
        names = _ranks(ranks)
        why = f"the loss of {node.place}, which ran {names},"
        with self._lock:
            for rank in ranks:
                record = self._ranks[rank]
                record.state = RankState.FAILED
                record.final = replace(_running(record), exited=True, ended_at=now)
                self._failures.append((now, Failure(rank, "died", cause=why)))
        if ranks:
            self._route(
                Notice(f"{node.place} was lost ({type(exc).__name__}): {names} ended with it")
            )
            for rank in ranks:
                self._route(StateChanged(rank, RankState.FAILED))
        self.stop(RunStatus.FAILED)
        self._node_ended(node)

    def _node_ended(self, node: _Node) -> None:
        with self._lock:
            node.ended = True
            last = all(n.ended for n in self._nodes)
        if last:
            self._finish()

    def _reply(self, reply: Reply) -> None:
        """A session rank's answer: landed, to ``_message``."""
        body: Body = None
        if reply.kind == "stacks":
            self._ranks[reply.rank].stacks = "written"
        elif isinstance(reply.body, ShippedReply):
            body = land_reply(reply.body)
        elif isinstance(reply.body, ShippedError):
            body = land_error(reply.body)
        self._message(reply.rank, reply.kind, body)

    def _close_node(self, node: _Node, batch: Batch) -> None:
        assert batch.outcomes is not None
        with self._lock:
            node.status = batch.status
            for shipped in batch.outcomes:
                rank = shipped.outcome.rank
                self._waits.end(rank)
                error = self._land(rank, shipped.error)
                value = land_value(shipped.value) if shipped.value is not None else None
                final = replace(shipped.outcome, value=value, error=error)
                self._ranks[rank].final = replace(final, started_at=self._ranks[rank].started_at)
                if error is not None:
                    self._log(rank, error.logged)  # as the relay keeps it locally
            # A rank that died says on which node (and its exit says how).
            for i, (when, failure) in enumerate(self._failures):
                mine = failure.rank in node.place.ranks
                if mine and failure.kind == "died" and failure.cause is None:
                    last = self._ranks[failure.rank].final
                    how = describe_exit(last.exit_code if last is not None else None)
                    self._failures[i] = (when, replace(failure, cause=f"{how} on {node.place}"))

    def _land(self, rank: int, shipped: ShippedError | None) -> ErrorInfo | None:
        """A rank's error, landed once (its failure and its outcome share it)."""
        if shipped is None:
            return None
        if rank not in self._errors:
            self._errors[rank] = land_error(shipped)
        return self._errors[rank]

    def _schedule_stop(self) -> None:
        """A rank failed: the others get ``failure_grace`` to say their own, then stop."""
        with self._lock:
            if self._stop_timer is not None or self._done.is_set():
                return
            timer = self._stop_timer = threading.Timer(
                self.config.job.failure_grace, self.stop, (RunStatus.FAILED,)
            )
        timer.daemon = True
        timer.start()

    def _log(self, rank: int, text: str) -> None:
        log = self._logs.get(rank)
        if log is None:
            log = self._logs[rank] = open(rank_log(self.log_dir, rank), "ab")  # noqa: SIM115
        log.write(text.encode("utf-8", "replace"))
        log.flush()

    def _finish(self) -> None:
        """Every node has ended: the run has (see ``Job._end``)."""
        if self._done.is_set():
            return
        self._ended_at = time.monotonic()
        with self._lock:
            if self._stop_timer is not None:
                self._stop_timer.cancel()
            for log in self._logs.values():
                log.close()
            self._logs.clear()
        self._payload = None
        agents = self._agents
        if agents is not None:
            with contextlib.suppress(Exception):
                agents.handles[0].close_store.remote(self.run_id)
            agents.detach(self.run_id)
        self._run_dir.release()
        self._ending()
        self._done.set()
        self._route(Done())

    # -- hooks (``cluster.session``) ----------------------------------------------

    def _route(self, event: RunEvent) -> None:
        """Hand ``event`` to the run's reader: ``events``."""
        self.events.put(event)

    def _message(self, rank: int, kind: str, body: Body) -> None:
        """A session rank's answer (a one-shot run has none)."""

    def _put_off(self) -> float | None:
        """For a session cell's timeout that fires: how much later to look again, as time
        ranks spent at a prompt is the user's (``Job._put_off``); None: it stands. A
        run's own timeout is each node's job's."""
        owed = self._waits.owed()
        return max(owed, PROMPT_RECHECK) if owed > 0 or self._waits.waiting else None

    def _ending(self) -> None:
        """Every node has ended; called once, before ``wait`` returns True."""


def _ranks(ranks: list[int]) -> str:
    return f"rank{'s' * (len(ranks) != 1)} {', '.join(map(str, ranks))}"


def _get(ray: Ray, refs: Ray, timeout: float) -> Ray:
    """``ray.get``, raising what the agent raised itself (a busy port, a worker that
    could not start) rather than Ray's wrapper of it."""
    from ray.exceptions import RayTaskError

    try:
        return ray.get(refs, timeout=timeout)
    except RayTaskError as exc:
        cause = exc.cause
        if isinstance(cause, Exception):
            raise cause from None
        raise


def _running(record: _Rank) -> RankOutcome:
    stacks = record.stacks if record.stacks in ("asked", "written", "signalled") else None
    return RankOutcome(
        rank=record.rank,
        state=record.state,
        pid=record.pid,
        exit_code=None,
        exited=False,
        value=None,
        error=None,
        started_at=record.started_at,
        ended_at=None,
        stacks=stacks,  # type: ignore[arg-type]
    )


def _node_reason(statuses: list[RunStatus | None]) -> RunStatus | None:
    """How the nodes say the run ended when the notebook did not stop it."""
    for reason in (RunStatus.TIMEOUT, RunStatus.INTERRUPTED, RunStatus.STOPPED, RunStatus.FAILED):
        if reason in statuses:
            return reason
    return None
