"""A node's part of one run, as its agent runs it: a local ``Job`` whose events go to the
agent's inbox with global ranks.

Contract: ``NodeJob(spec, payload, node, run_id, inbox)`` is a ``launcher.job.Job``
for the ranks ``node`` (``NodeSlice``) starts on this machine; everything it
would put on its own event queue goes instead to ``inbox`` as ``(run_id,
event)``, ranks made global, so that one long poll serves every run the agent
holds. ``NodeSessionJob`` runs a session's ranks (``nbddp.rank.session.serve``):
the notebook drives its cells (``launcher.session_job.Cells`` runs there, over
every node), so each rank's ``cell_done``/``regrouped`` answer and each stack
dump it writes are forwarded as a ``Reply``, the rank's output read first (its
cell's output is complete when the notebook reads the reply); ``send`` and
``send_cell`` carry the notebook's requests to the ranks. Runs in the agent.
"""

from __future__ import annotations

import queue
from dataclasses import dataclass, replace

from nbddp.cluster.portable import ShippedError, ShippedReply, ship_error, ship_reply
from nbddp.launcher.config import JobSpec, NodeSlice
from nbddp.launcher.events import InputAsked, MetricRows, RunEvent, StateChanged, Text
from nbddp.launcher.job import Job
from nbddp.wire.payload import Payload
from nbddp.wire.protocol import Body, CellOrder, CellReply, ErrorInfo


@dataclass(frozen=True)
class Reply:
    """A session rank's answer, for the notebook's cells (global ``rank``)."""

    rank: int
    kind: str
    """``cell_done`` (``body``: a ``ShippedReply``), ``regrouped`` (a ``ShippedError`` or
    None) or ``stacks`` (None: it wrote its stacks)."""
    body: ShippedReply | ShippedError | None


Inbox = queue.SimpleQueue[tuple[str, "RunEvent | Reply"]]
"""The agent's one queue of ``(run id, event)`` for every run it holds."""


class NodeJob(Job):
    """One run's ranks on this node (see module contract)."""

    def __init__(
        self, spec: JobSpec, payload: Payload, node: NodeSlice, run_id: str, inbox: Inbox
    ) -> None:
        super().__init__(spec, payload, node)
        self.first = node.first_rank
        self.inbox = inbox
        self.cluster_run = run_id
        """The notebook's id of the run (each node's job has a local ``run_id`` too)."""

    def _route(self, event: RunEvent) -> None:
        self.inbox.put((self.cluster_run, _global(event, self.first)))


class NodeSessionJob(NodeJob):
    """A session's ranks on this node (see module contract)."""

    CTRL_RESTS = False  # a cell ends when its replies are read: they must not wait a tick

    def on_message(self, rank: int, kind: str, body: Body) -> None:
        super().on_message(rank, kind, body)
        if kind == "stacks":
            self.inbox.put((self.cluster_run, Reply(rank + self.first, "stacks", None)))

    def _message(self, rank: int, kind: str, body: Body) -> None:
        if kind == "cell_done" and isinstance(body, CellReply):
            shipped: ShippedReply | ShippedError | None = ship_reply(body)
        elif kind == "regrouped":
            shipped = ship_error(body) if isinstance(body, ErrorInfo) else None
        else:
            return
        self._drain(rank)  # everything it printed before replying, first
        self.inbox.put((self.cluster_run, Reply(rank + self.first, kind, shipped)))

    def send(self, rank: int, kind: str, body: object) -> None:
        """Send a request to global ``rank`` of this node (any thread)."""
        self._call_soon(self._send, rank - self.first, kind, body)

    def send_cell(self, number: int, payload: Payload, debug: bool = False) -> None:
        """Send cell ``number`` to every rank of this node (any thread)."""
        self._call_soon(self._send_cell, CellOrder(number, payload.ref(), debug))

    def ask_stacks(self, ranks: list[int]) -> None:
        """Ask global ``ranks`` of this node for their stacks (any thread)."""
        self._call_soon(self._ask_stacks, [r - self.first for r in ranks])

    def _send_cell(self, order: CellOrder) -> None:
        try:
            for rank in range(self.node.ranks):
                self._send(rank, "cell", order)  # a closed link ends the session
        finally:
            order.call.fds.close()  # every rank has its own copies of the descriptors now


def _global(event: RunEvent, first: int) -> RunEvent:
    """``event`` with its rank made global."""
    if isinstance(event, Text | StateChanged | MetricRows | InputAsked):
        return replace(event, rank=event.rank + first)
    return event
