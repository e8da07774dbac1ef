"""A node's part of one run, as its agent runs it: a local ``Job`` whose events go to the
agent's inbox with global ranks.

Contract: ``NodeRun(spec, payload, node, run_id, inbox, session)`` starts the
ranks of ``node`` (``NodeSlice``) as a ``launcher.job.Job`` and listens to its
run core: every event goes to ``inbox`` as ``(run_id, event)``, ranks made
global, so that one long poll serves every run the agent holds. A session's
rank answers (``cell_done``, ``regrouped``, a stack dump written) go as a
``Reply``, the rank's output read first; ``send``, ``send_cell`` and
``ask_stacks`` carry the notebook's requests to the ranks (any thread).
"""

from __future__ import annotations

import queue
from dataclasses import dataclass, replace

from nbddp.launcher.config import JobSpec, NodeSlice
from nbddp.launcher.events import InputAsked, MetricRows, RunEvent, StateChanged, Text
from nbddp.launcher.job import Job
from nbddp.wire.payload import Payload
from nbddp.wire.protocol import Answer, Body


@dataclass(frozen=True)
class Reply:
    """A session rank's answer, for the notebook's cells (global ``rank``)."""

    rank: int
    kind: str
    """``cell_done`` (``body``: a ``CellReply``), ``regrouped`` (an ``ErrorInfo`` or
    None) or ``stacks`` (None: it wrote its stacks)."""
    body: Body


Inbox = queue.SimpleQueue[tuple[str, "RunEvent | Reply"]]
"""The agent's one queue of ``(run id, event)`` for every run it holds."""


class NodeRun:
    """One run's ranks on this node."""

    def __init__(
        self,
        spec: JobSpec,
        payload: Payload,
        node: NodeSlice,
        run_id: str,
        inbox: Inbox,
        session: bool = False,
    ) -> None:
        self.job = Job(spec, payload, node, session=session)
        self.core = self.job.core
        self.core.listener = self
        self.first = node.first_rank
        self.inbox = inbox
        self.session = session
        self.cluster_run = run_id
        """The notebook's id of the run (each node's job has a local ``run_id`` too)."""

    # -- the core's listener (loop thread) ------------------------------------------

    def route(self, event: RunEvent) -> None:
        if isinstance(event, Text | StateChanged | MetricRows | InputAsked):
            event = replace(event, rank=event.rank + self.first)  # made global
        self.inbox.put((self.cluster_run, event))

    def message(self, rank: int, kind: str, body: Body) -> None:
        if not self.session or kind not in ("cell_done", "regrouped", "stacks"):
            return
        self.job.drain(rank)  # everything it printed before replying, first
        self.inbox.put((self.cluster_run, Reply(rank + self.first, kind, body)))

    def ending(self) -> None:
        """Nothing to do: ``Done`` reaches the inbox as every event does."""

    # -- the agent's requests of the same names, ranks global (any thread) ----------------

    def send(self, rank: int, kind: str, body: object) -> None:
        self.core.call_soon(self.job.send, rank - self.first, kind, body)

    def send_cell(self, number: int, payload: Payload, debug: bool = False) -> None:
        order = self.job.cell_order(number, payload, debug)
        self.core.call_soon(self.job.send_cell, order, list(range(self.job.node.ranks)))

    def ask_stacks(self, ranks: list[int]) -> None:
        self.core.call_soon(self.job.ask_stacks, [r - self.first for r in ranks])

    def answer(self, rank: int, number: int, text: Answer) -> None:
        self.core.answer(rank - self.first, number, text)
