"""``ClusterJob``: the notebook side of a run across a Ray cluster's nodes.

Contract: ``ClusterJob(config, payload).start()`` places one agent per node
(``nodes.place``), has agent 0 host the rendezvous store on its node address,
ships the call once (``ray.put``; its large CPU tensors as bytes, landing in
shared memory on each node) and starts every node's slice. It is a
``launcher.run.RunSource``: ``Run``, the displays, ``failures.run_error`` and
``%%ddp`` read it exactly as they read a local ``Job``: typed events on
``events`` (global ranks, ending with one ``Done``), ``outcomes()``,
``root_cause``, ``status``, ``wait``, ``elapsed``, ``pids`` (each on its own
node), ``stop`` and ``dump_stacks`` (sent to every node).

One thread per node follows its agent's long poll and writes each rank's
output to the rank's log here, as the relay does locally. A failure on any
node stops every node after ``failure_grace`` (the root cause is the earliest
by the ranks' own clocks, as locally). A node whose agent is lost (the node
went down, its agent was killed) ends its ranks as failed: the run is stopped
and raises ``RankExitedError`` for the first of them, with a notice naming the
node and all its ranks. The run has ended once every node's ranks have.
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
from nbddp.cluster.nodes import Ray
from nbddp.cluster.portable import ShippedError, land_error, land_value, ship_payload
from nbddp.launcher.config import LaunchConfig, NodeSlice
from nbddp.launcher.events import (
    Done,
    Failure,
    Notice,
    RankOutcome,
    RankState,
    RunEvent,
    RunStatus,
    StateChanged,
    Text,
    run_status,
)
from nbddp.launcher.failures import local_time, root_cause
from nbddp.launcher.logs import new_run_dir, rank_log
from nbddp.wire.payload import Payload
from nbddp.wire.protocol import ErrorInfo

POLL_WAIT = 0.5  # seconds an agent's long poll waits when nothing happens
LOST_AFTER = 10.0  # seconds beyond POLL_WAIT without an answer before a node counts as lost
START_TIMEOUT = 120.0  # seconds the nodes get to start their ranks (a first torch import)


def release_agents() -> None:
    """Hand back the agents kept for the next launch (``nbddp.cluster.release``)."""
    nodes.release_agents()


@dataclass
class _Node:
    """What the notebook knows of one node's agent."""

    index: int
    handle: Ray
    address: str
    ranks: range
    ended: bool = False
    status: RunStatus | None = None


@dataclass
class _Rank:
    rank: int
    state: RankState = RankState.STARTING
    pid: int | None = None
    started_at: float = field(default_factory=time.monotonic)
    final: RankOutcome | None = None


class ClusterJob:
    """One run across a cluster's nodes (see module contract)."""

    def __init__(self, config: LaunchConfig, payload: Payload) -> None:
        self.config = config
        self._payload: Payload | None = payload
        self.run_id = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
        self._run_dir = new_run_dir(self.run_id)
        self.log_dir = self._run_dir.path
        self.events: queue.SimpleQueue[RunEvent] = queue.SimpleQueue()
        self._ranks = [_Rank(r) for r in range(config.job.world_size)]
        self._nodes: list[_Node] = []
        self._lock = threading.Lock()  # guards everything the node threads change
        self._failures: list[tuple[float, Failure]] = []
        self._errors: dict[int, ErrorInfo] = {}  # landed once per rank
        self._stop_reason: RunStatus | None = None
        self._stop_timer: threading.Timer | None = None
        self._logs: dict[int, IO[bytes]] = {}
        self._done = threading.Event()
        self._started_at = time.monotonic()
        self._ended_at: float | None = None
        self._agents: nodes.Agents | None = None
        self._lost_node = False

    # -- starting ---------------------------------------------------------

    def start(self) -> None:
        """Place the agents, host the store, start every node's ranks (caller thread)."""
        payload = self._payload
        if payload is None:
            raise RuntimeError("this job has already run; start a new one")
        shipped = ship_payload(payload)
        agents = self._agents = nodes.place(self.config)
        ray = nodes.import_ray()
        spec, count = self.config.job, self.config.nodes
        per = spec.world_size // count
        port = _get(ray, agents.handles[0].host_store.remote(spec.port), START_TIMEOUT)
        ref = ray.put(shipped)  # once: each node fetches it once, whatever its ranks
        master = agents.infos[0].address
        calls = []
        for i, (handle, info) in enumerate(zip(agents.handles, agents.infos, strict=True)):
            part = NodeSlice(i, count, i * per, per, master, port)
            self._nodes.append(_Node(i, handle, info.address, range(i * per, (i + 1) * per)))
            calls.append(handle.start.remote(spec, part, ref))
        try:
            pids = _get(ray, calls, START_TIMEOUT)
        except BaseException:
            nodes.forget(agents)  # whatever started is ended with its agents
            self._end_now()
            raise
        for node_pids in pids:
            for rank, pid in node_pids.items():
                self._ranks[rank].pid = pid
        for node in self._nodes:
            threading.Thread(
                target=self._follow, args=(node,), name=f"nbddp-node{node.index}", daemon=True
            ).start()

    def _end_now(self) -> None:
        for record in self._ranks:
            record.state = RankState.STOPPED
        for node in self._nodes:
            node.ended = True
        self._finish()

    # -- RunSource ----------------------------------------------------------

    def stop(self, reason: RunStatus = RunStatus.STOPPED) -> None:
        """Stop every rank on every node (any thread)."""
        with self._lock:
            if self._stop_reason is None:
                self._stop_reason = reason
            live = [n for n in self._nodes if not n.ended]
        for node in live:
            with contextlib.suppress(Exception):
                node.handle.stop.remote(reason)

    def dump_stacks(self) -> None:
        """Have every running rank on every node write its stacks into its output."""
        for node in self._nodes:
            if not node.ended:
                with contextlib.suppress(Exception):
                    node.handle.dump_stacks.remote()

    def answer(self, rank: int, number: int, text: str | None) -> None:
        """Send ``rank`` (global) the user's line for its prompt, through its node's agent."""
        for node in self._nodes:
            if rank in node.ranks and not node.ended:
                with contextlib.suppress(Exception):
                    node.handle.answer.remote(rank - node.ranks.start, number, text)

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

    @property
    def root_cause(self) -> Failure | None:
        """The earliest failure on any node (``failures.root_cause``)."""
        with self._lock:
            return root_cause(list(self._failures), self.config.job.failure_grace)

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

    # -- following the nodes (one thread each) -------------------------------

    def _follow(self, node: _Node) -> None:
        ray = nodes.import_ray()
        try:
            while not node.ended:
                try:
                    batch = ray.get(
                        node.handle.poll.remote(POLL_WAIT), timeout=POLL_WAIT + LOST_AFTER
                    )
                except Exception as exc:  # the agent or its node is gone
                    self._lost(node, exc)
                    return
                self._take(node, batch)
        finally:
            with self._lock:
                node.ended = True
                last = all(n.ended for n in self._nodes)
            if last:
                self._finish()

    def _take(self, node: _Node, batch: Batch) -> None:
        for event in batch.events:
            if isinstance(event, Text):
                self._log(event.rank, event.text)
            elif isinstance(event, StateChanged):
                self._ranks[event.rank].state = event.state
            self.events.put(event)
        if batch.failures:
            with self._lock:
                for shipped in batch.failures:
                    error = self._land(shipped.failure.rank, shipped.error)
                    failure = replace(shipped.failure, error=error)
                    self._failures.append((local_time(shipped.at) or time.monotonic(), failure))
            self._schedule_stop()
        if batch.outcomes is not None:
            self._close_node(node, batch)

    def _close_node(self, node: _Node, batch: Batch) -> None:
        assert batch.outcomes is not None
        with self._lock:
            node.status = batch.status
            for shipped in batch.outcomes:
                rank = shipped.outcome.rank
                error = self._land(rank, shipped.error)
                value = land_value(shipped.value) if shipped.value is not None else None
                final = replace(shipped.outcome, value=value, error=error)
                self._ranks[rank].final = replace(final, started_at=self._ranks[rank].started_at)
                if error is not None:
                    self._log(rank, error.logged)  # as the relay keeps it locally
            node.ended = True

    def _land(self, rank: int, shipped: ShippedError | None) -> ErrorInfo | None:
        """A rank's error, landed once (its failure and its outcome share it)."""
        if shipped is None:
            return None
        if rank not in self._errors:
            self._errors[rank] = land_error(shipped)
        return self._errors[rank]

    def _lost(self, node: _Node, exc: BaseException) -> None:
        """The node's agent is gone: its ranks ended with it (see module contract)."""
        self._lost_node = True  # its agents are not kept for the next launch
        now = time.monotonic()
        ranks = [r for r in node.ranks if self._ranks[r].final is None]
        names = f"rank{'s' * (len(ranks) > 1)} {', '.join(map(str, ranks))}"
        why = f"the loss of node {node.index} ({node.address}), which ran {names},"
        with self._lock:
            for rank in ranks:
                record = self._ranks[rank]
                record.state = RankState.FAILED
                record.final = replace(_running(record), exited=True, ended_at=now)
                self._failures.append((now, Failure(rank, "died", cause=why)))
        if ranks:
            self.events.put(
                Notice(
                    f"node {node.index} ({node.address}) was lost ({type(exc).__name__}): "
                    f"{names} ended with it"
                )
            )
            for rank in ranks:
                self.events.put(StateChanged(rank, RankState.FAILED))
        self.stop(RunStatus.FAILED)

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
        if self._nodes:
            with contextlib.suppress(Exception):
                self._nodes[0].handle.close_store.remote()
        self._run_dir.release()
        if self._lost_node and self._agents is not None:
            nodes.forget(self._agents)  # the next launch places agents afresh
        self._done.set()
        self.events.put(Done())


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
    )


def _node_reason(statuses: list[RunStatus | None]) -> RunStatus | None:
    """How the nodes say the run ended when the notebook did not stop it."""
    for reason in (RunStatus.TIMEOUT, RunStatus.INTERRUPTED, RunStatus.STOPPED, RunStatus.FAILED):
        if reason in statuses:
            return reason
    return None
