"""``ClusterJob``: the transport of a run across a cluster's nodes.

Contract: ``ClusterJob(config, payload, session=False).start()`` takes agents (``ray_engine.place``:
kept ones of the same shape, or new ones), attaches to them under its run id, has agent 0 host the
run's rendezvous store on its node address, shares the call once (``Engine.share``) and starts every
node's slice of the run as a job of its own there, so any number of runs go on at once. Its ``core``
(``launcher.core.RunCore``, global ranks) is what ``Run``, the displays and the failures read,
exactly as for a local ``Job``; the agents' batches are posted to the relay loop, where the core is
kept. ``nodes`` says where each node's ranks run (node 0 hosts the store: ``MASTER_ADDR``), also
said by the first run on new agents and in the error of a rank that died. A node whose agent is lost
ends its ranks as failed, naming the node. With ``session=True`` the ranks are a session's, driven
by ``launcher.cells.Cells`` through ``send``, ``send_cell`` and ``ask_stacks``, each through the
rank's node's agent.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass, replace

from nbddp.agent.node import Batch
from nbddp.agent.noderun import Reply
from nbddp.agent.portable import ship_payload
from nbddp.cluster import ray_engine, slurm_engine
from nbddp.cluster.agents import Agents, Channel, release_agents
from nbddp.launcher.clusters import SlurmCluster
from nbddp.launcher.config import LaunchConfig, NodeSlice
from nbddp.launcher.core import STACKS_WAIT, RunCore
from nbddp.launcher.events import (
    Failure,
    InputAsked,
    Notice,
    RankState,
    RunStatus,
    StateChanged,
    Text,
)
from nbddp.launcher.failures import describe_exit, local_time, who
from nbddp.launcher.logs import RankLogs
from nbddp.wire.payload import Payload
from nbddp.wire.protocol import Answer, ErrorInfo
from nbddp.wire.shm import Mark

START_TIMEOUT = 120.0  # seconds the nodes get to start their ranks (a first torch import)

__all__ = ["ClusterJob", "release_agents"]


@dataclass
class _Node:
    """What the notebook knows of one node's part of the run."""

    place: NodeSlice
    channel: Channel
    ended: bool = False
    status: RunStatus | None = None


class ClusterJob:
    """One run across a cluster's nodes."""

    def __init__(self, config: LaunchConfig, payload: Payload, *, session: bool = False) -> None:
        self.config = config
        self.spec = config.job
        self.session = session
        self._payload: Payload | None = payload
        self.core = RunCore(config.job.world_size, config.job.failure_grace)
        self.core.transport = self
        self.log_dir, self.run_id = self.core.log_dir, self.core.run_id
        self._logs = RankLogs(self.log_dir)
        self._nodes: list[_Node] = []
        self._errors: dict[int, ErrorInfo] = {}  # landed once per rank
        self._agents: Agents | None = None
        self._held: frozenset[Mark] = frozenset()  # what the nodes hold (``ship_payload``)

    # -- starting ---------------------------------------------------------

    def start(self) -> None:
        """Take agents, host the store, start every node's ranks (caller thread)."""
        assert self._payload is not None, "a job starts once, right after it is made"
        shipped = ship_payload(self._payload)
        self._held = shipped[3]
        slurm = isinstance(self.config.cluster, SlurmCluster)
        agents = self._agents = (slurm_engine.place if slurm else ray_engine.place)(self.config)
        spec, count = self.config.job, self.config.nodes
        per, master = spec.world_size // count, agents.infos[0].address
        for i, (channel, info) in enumerate(zip(agents.channels, agents.infos, strict=True)):
            place = NodeSlice(i, count, i * per, per, master, None, address=info.address)
            self._nodes.append(_Node(place, channel))
        fresh = agents.attach(self.run_id, self, session=self.session)
        try:
            hosted = agents.channels[0].call("host_store", self.run_id, spec.port)
            port = hosted.result(START_TIMEOUT)
            assert isinstance(port, int)
            shared = agents.engine.share(shipped)
            calls = [
                node.channel.call(
                    "start", self.run_id, spec, replace(node.place, port=port), shared, self.session
                )
                for node in self._nodes
            ]
            pids = [call.result(START_TIMEOUT) for call in calls]
        except BaseException:
            self._abandon_start(agents)
            raise
        for node_pids in pids:
            assert isinstance(node_pids, dict)
            for rank, pid in node_pids.items():
                self.core.records[rank].pid = pid
        if fresh:  # where the ranks run, said once per set of agents
            where = "; ".join(f"{n.place}: {who(list(n.place.global_ranks))}" for n in self._nodes)
            notice = Notice(f"on {where}; node 0 hosts the store (MASTER_ADDR)")
            self.core.call_soon(self.core.route, notice)

    def _abandon_start(self, agents: Agents) -> None:
        """Starting failed part-way: what started goes (its job, or the ``agents`` when no
        other run uses them), and the run ends."""
        agents.detach(self.run_id)
        if not agents.in_use():
            agents.broken = True  # whatever started is ended with its agents
            release_agents()
        else:
            self._tell_all("stop", self.run_id, RunStatus.FAILED)
        for record in self.core.records:
            record.state = RankState.STOPPED
        for node in self._nodes:
            node.ended = True
        self.core.call_soon(self.core.end)
        self.core.wait(START_TIMEOUT)

    @property
    def nodes(self) -> tuple[NodeSlice, ...]:
        """Where each node's ranks run, by node rank."""
        return tuple(n.place for n in self._nodes)

    def node_of(self, rank: int) -> NodeSlice:
        """The node global ``rank`` runs on."""
        return next(n.place for n in self._nodes if rank in n.place.global_ranks)

    # -- the transport (loop thread) ---------------------------------------------

    def stop_ranks(self, reason: RunStatus) -> None:
        self._tell_all("stop", self.run_id, reason)

    def answer(self, rank: int, number: int, text: Answer) -> None:
        """Send ``rank`` (global) the user's line for its prompt, through its node's agent."""
        self._tell_rank(rank, "answer", "answer", self.run_id, rank, number, text)

    def ask_stacks(self, ranks: Iterable[int]) -> list[int]:
        """Ask ``ranks`` for their stacks (a run: every running rank, by each node's job;
        a session: the ranks given); the agents signal those that do not answer."""
        asked = sorted(ranks)
        if not self.session:
            self._tell_all("dump_stacks", self.run_id)
            return asked
        for node in self._nodes:
            mine = [r for r in asked if r in node.place.global_ranks]
            for rank in mine:
                self.core.records[rank].stacks = "asked"
            if mine:
                self._tell(node.place.node_rank, "ask_stacks", self.run_id, mine)
        self.core.later(STACKS_WAIT, _signalled, self.core, asked)
        return asked

    def send(self, rank: int, kind: str, body: object) -> None:
        """A session's request to global ``rank``, through its node's agent (as ``answer``)."""
        self._tell_rank(rank, kind, "send", self.run_id, rank, kind, body)

    def drain(self, rank: int) -> None:
        """Nothing to do: the agent read the rank's output before it sent its reply."""

    def log(self, rank: int, text: str) -> None:
        self._logs.write(rank, text)

    def where(self, rank: int) -> str:
        return f" on {self.node_of(rank)}"

    def cell_order(self, number: int, payload: Payload, debug: bool) -> tuple[object, ...]:
        """A session cell's call, shared once for every node (caller thread): the
        agents' ``send_cell`` arguments after the run id."""
        assert self._agents is not None
        shipped = ship_payload(payload, self._held)
        self._held = shipped[3]
        return number, self._agents.engine.share(shipped), debug

    def send_cell(self, order: object, ranks: list[int]) -> None:
        assert isinstance(order, tuple)
        if ranks:
            self._tell_all("send_cell", self.run_id, *order)

    def release(self) -> None:
        """The run has ended on every node: its logs, store and agents go."""
        self._logs.close()
        self._payload = None
        agents = self._agents
        assert agents is not None, "a run ends once its agents were placed"
        # Every node has ended by now, so not ``_tell``: agent 0 still holds the store.
        with contextlib.suppress(Exception):  # a lost node 0 took its store with it
            agents.channels[0].call("close_store", self.run_id)
        agents.detach(self.run_id)

    # -- internals (loop thread) ---------------------------------------------------

    def _error(self, rank: int, error: ErrorInfo | None) -> ErrorInfo | None:
        """``rank``'s error as first landed: its failure and its outcome share it."""
        return None if error is None else self._errors.setdefault(rank, error)

    def _tell(self, index: int, method: str, *args: object) -> bool:
        node = self._nodes[index]
        if node.ended:
            return False
        try:
            node.channel.call(method, *args)
        except Exception:
            return False  # its node is lost: the run ends with it
        return True

    def _tell_rank(self, rank: int, kind: str, method: str, *args: object) -> None:
        """``_tell`` ``rank``'s node; a notice when its ``kind`` message cannot go there."""
        node = self.node_of(rank)
        if not self._tell(node.node_rank, method, *args) and not self.core.wait(0):
            self.core.route(Notice(f"rank {rank}'s {kind!r} message was not sent: {node} is gone"))

    def _tell_all(self, method: str, *args: object) -> None:
        for node in self._nodes:
            self._tell(node.place.node_rank, method, *args)

    def take(self, index: int, batch: Batch) -> None:
        """Node ``index``'s agent sent this run ``batch`` (loop thread)."""
        node, core = self._nodes[index], self.core
        if node.ended:
            return
        for event in batch.events:
            if isinstance(event, Reply):  # a session rank's answer, to the cells
                if event.kind == "stacks":
                    core.records[event.rank].stacks = "written"
                core.message(event.rank, event.kind, event.body)
                continue
            if isinstance(event, Text):
                self._logs.write(event.rank, event.text)
            elif isinstance(event, StateChanged):
                core.records[event.rank].state = event.state
                if event.state is not RankState.WAITING:
                    core.waits.end(event.rank)
            elif isinstance(event, InputAsked):
                core.waits.begin(event.rank)
            core.route(event)
        for at, failure in batch.failures:
            error = self._error(failure.rank, failure.error)
            core.fail(replace(failure, error=error, where=self.where(failure.rank)), local_time(at))
        if batch.outcomes is not None:
            self._close_node(node, batch)

    def node_lost(self, index: int, exc: BaseException) -> None:
        """Node ``index``'s agent is gone: its ranks ended with it (loop thread)."""
        node, core = self._nodes[index], self.core
        if node.ended:
            return
        ranks = [r for r in node.place.global_ranks if not core.records[r].exited]
        names = who(ranks)
        # The channel's own words where it has them (Slurm: the step's end, a time limit).
        said = f" ({exc})" if isinstance(exc, ConnectionError) and str(exc) else ""
        why = f"the loss of {node.place}, which ran {names}{said},"
        if ranks:
            core.route(
                Notice(f"{node.place} was lost{said or f' ({type(exc).__name__})'}: {names} ended")
            )
        for rank in ranks:
            record = core.records[rank]
            record.state, record.exited = RankState.FAILED, True
            core.fail(Failure(rank, "died", cause=why))
            core.route(StateChanged(rank, RankState.FAILED))
        core.halt(RunStatus.FAILED)
        self._close_node(node, None)

    def _close_node(self, node: _Node, batch: Batch | None) -> None:
        """Node ``node``'s ranks have all ended (``batch``: their outcomes; None: lost
        with it); the run has once every node's have."""
        core = self.core
        node.ended = True
        for outcome in batch.outcomes or () if batch is not None else ():
            record = core.records[outcome.rank]
            core.waits.end(outcome.rank)
            record.error = self._error(outcome.rank, outcome.error)
            record.value, record.state, record.pid = outcome.value, outcome.state, outcome.pid
            record.exit_code, record.exited = outcome.exit_code, True
            record.ended_at, record.stacks = outcome.ended_at, outcome.stacks
            if record.error is not None:
                self._logs.write(outcome.rank, record.error.logged)  # as the relay keeps it
        if batch is not None:
            node.status = batch.status
            # A rank that died says on which node (and its exit says how).
            for i, (when, failure) in enumerate(core.failed):
                if failure.rank in node.place.global_ranks and failure.kind == "died":
                    code = core.records[failure.rank].exit_code
                    how = failure.cause or f"{describe_exit(code)} on {node.place}"
                    core.failed[i] = (when, replace(failure, cause=how))
        if all(n.ended for n in self._nodes):
            core.stop_reason = core.stop_reason or _node_reason([n.status for n in self._nodes])
            core.end()


def _node_reason(statuses: list[RunStatus | None]) -> RunStatus | None:
    """How the nodes say the run ended when the notebook did not stop it."""
    reasons = (RunStatus.TIMEOUT, RunStatus.INTERRUPTED, RunStatus.STOPPED, RunStatus.FAILED)
    return next((reason for reason in reasons if reason in statuses), None)


def _signalled(core: RunCore, ranks: list[int]) -> None:
    """The agents signal ranks that did not answer for their stacks in time."""
    for rank in ranks:
        if core.records[rank].stacks == "asked":
            core.records[rank].stacks = "signalled"
