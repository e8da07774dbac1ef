"""A session across a cluster's nodes: ranks on every node that keep their state.

Contract: ``ClusterSessionJob(config, payload)`` is what ``notebook.session``
drives for ``nbddp.session(nodes=..., cluster=...)``: the cells of
``launcher.session_job.Cells`` (one at a time, each its own ``CellSource``,
with the same rules for failures, interrupts, timeouts and the end of the
session) over ranks that a ``ClusterJob`` started on every node as a
session's (each agent runs its node's ranks as a ``nodejobs.NodeSessionJob``
and forwards their replies, their output first). The cells' bookkeeping runs
on the relay's loop thread: the agents' batches are posted there.

Reaching the ranks: a cell's call is shipped once (``ray.put``) and each
agent hands it to its ranks; interrupts, ``close_group``, ``regroup`` and
``end`` go to each rank through its agent. A rank blocked in a collective
whose peer failed is freed as on one machine: after ``failure_grace`` the
busy ranks are interrupted; still busy, the idle ranks on every node close
their process group (gloo), which breaks the blocked one's wait, and every
rank joins a new group (``nbddp.rank.regroup``, through node 0's store);
otherwise the session ends with the message that says why. A rank that dies,
or a node that is lost, ends the session: ``lost`` names the rank and its
node.

The session's agents stay while it lives (it is attached to them as a run):
they are not handed back when idle, nor for another driver's demand.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from nbddp.cluster import nodes
from nbddp.cluster.agent import Batch
from nbddp.cluster.client import ClusterJob
from nbddp.cluster.portable import ship_payload
from nbddp.launcher.config import LaunchConfig
from nbddp.launcher.events import RunStatus
from nbddp.launcher.job import STACKS_WAIT
from nbddp.launcher.relay import loop
from nbddp.launcher.session_job import Cells
from nbddp.wire.payload import Payload


class ClusterSessionJob(Cells, ClusterJob):
    """A session's ranks on every node (see module contract)."""

    SESSION = True

    def __init__(self, config: LaunchConfig, payload: Payload) -> None:
        ClusterJob.__init__(self, config, payload)
        self._loop = loop()
        self._timers: list[asyncio.TimerHandle] = []
        self._init_cells(config.job.world_size)

    # -- the agents' batches, onto the loop ---------------------------------------

    def take(self, index: int, batch: Batch) -> None:
        self._loop.call(ClusterJob.take, self, index, batch)

    def node_lost(self, index: int, exc: BaseException) -> None:
        self._loop.call(ClusterJob.node_lost, self, index, exc)

    def _ending(self) -> None:
        timers, self._timers = self._timers, []
        for timer in timers:
            timer.cancel()
        Cells._ending(self)

    # -- services the cells use (loop thread, but ``_call_soon``) ----------------------

    def _call_soon(self, fn: Callable[..., object], *args: object) -> None:
        self._loop.call(fn, *args)

    def _later(self, delay: float, fn: Callable[..., object], *args: object) -> None:
        if self._done.is_set():
            return
        now = self._loop.loop.time()
        self._timers = [t for t in self._timers if not t.cancelled() and t.when() > now]
        self._timers.append(self._loop.call_later(delay, fn, *args))

    def _send(self, rank: int, kind: str, body: object) -> bool:
        handle = self._nodes[self.node_of(rank).index].handle
        try:
            handle.send.remote(self.run_id, rank, kind, body)
        except Exception:
            return False  # its node is lost: the run ends with it
        return True

    def _drain(self, rank: int) -> None:
        """Nothing to do: the agent read the rank's output before it sent its reply."""

    def _stop(self, reason: RunStatus) -> None:
        self.stop(reason)

    def _ask_stacks(self, ranks: Iterable[int]) -> list[int]:
        asked = sorted(ranks)
        for place in self.nodes:
            mine = [r for r in asked if r in place.ranks]
            if mine:
                for rank in mine:
                    self._ranks[rank].stacks = "asked"
                handle = self._nodes[place.index].handle
                handle.ask_stacks.remote(self.run_id, mine)
        # The agents signal ranks that did not answer by then (``Job._ask_stacks``).
        self._later(STACKS_WAIT, self._signalled, asked)
        return asked

    def _signalled(self, ranks: list[int]) -> None:
        for rank in ranks:
            if self._ranks[rank].stacks == "asked":
                self._ranks[rank].stacks = "signalled"

    def _cell_order(self, number: int, payload: Payload, debug: bool) -> object:
        ray = nodes.import_ray()
        return _Shipped(number, ray.put(ship_payload(payload)), debug)

    def _send_cell(self, order: object, ranks: list[int]) -> None:
        assert isinstance(order, _Shipped)
        if not ranks:
            return
        for node in self._nodes:
            try:
                node.handle.send_cell.remote(self.run_id, order.number, order.ref, order.debug)
            except Exception:
                pass  # its node is lost: the session ends with it

    def _where(self, rank: int) -> str:
        return f" on {self.node_of(rank)}"


@dataclass(frozen=True)
class _Shipped:
    """A cell's call, put in Ray's object store once for every node."""

    number: int
    ref: nodes.Ray
    debug: bool
    """A rank that raises opens a debugger first."""
