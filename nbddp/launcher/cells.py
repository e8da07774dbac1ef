"""A session's cells: ranks that stay up and run one cell after another.

Contract: ``Cells(transport)`` drives the cells of a session whose ranks a transport started as a
session's (``job.Job`` on this machine, a cluster job across nodes): ``start()`` starts them,
``cell(payload, timeout)`` sends one call to every rank and returns a ``CellSource``, what a ``Run``
reads for that cell alone (its own display, value and error). Cell 0 is the start: it ends once
every rank is idle with its process group (``ready``). One cell at a time (``SessionError``). When a
rank fails the others get ``failure_grace``, then are interrupted; ranks still blocked in a
collective are freed by closing the idle ranks' group and regrouping every rank (gloo; ``note`` says
what must be re-created), else the session ends and ``lost`` says why. Bookkeeping runs on the relay
loop (the cells are the run core's listener); other threads read frozen values.
"""

from __future__ import annotations

import collections
import threading
import time
from pathlib import Path
from typing import Protocol

from nbddp.errors import SessionError
from nbddp.launcher.cellsource import CellSource, CellState, stopped_by_us
from nbddp.launcher.config import JobSpec
from nbddp.launcher.core import STACKS_WAIT, RunCore, Transport
from nbddp.launcher.events import (
    Done,
    Failure,
    Notice,
    RankState,
    RunEvent,
    RunStatus,
    StateChanged,
)
from nbddp.launcher.failures import describe_exit, local_time
from nbddp.wire.payload import Payload
from nbddp.wire.protocol import Body, CellReply, ErrorInfo

INTERRUPT_GRACE = 3.0  # seconds interrupted ranks get to return to idle
REGROUP_WAIT = 30.0  # seconds every rank gets to join a new process group
REGROUPED = (
    "a rank was blocked in a collective: the process group was closed to free it and "
    "re-initialised on every rank; the session keeps its other state, but objects bound "
    "to the old group (a DistributedDataParallel wrapper, groups from new_group) must be re-created"
)
BETWEEN_CELLS = 1000  # events kept between cells, shown with the next one


class CellTransport(Transport, Protocol):
    """What the cells need of the session's transport beyond a run's (``core.Transport``)."""

    core: RunCore
    spec: JobSpec

    def start(self) -> None: ...
    def send(self, rank: int, kind: str, body: object) -> None:
        """Send ``(kind, body)`` to ``rank``: whole, or a notice says it was not."""

    def drain(self, rank: int) -> None: ...
    def log(self, rank: int, text: str) -> None: ...
    def cell_order(self, number: int, payload: Payload, debug: bool) -> object:
        """What carries cell ``number``'s call to the ranks (caller thread)."""

    def send_cell(self, order: object, ranks: list[int]) -> None:
        """Send ``order`` to ``ranks`` (none: drop it), then let it go (loop thread)."""

    def where(self, rank: int) -> str:
        """Where ``rank`` runs, as a message's words (empty: this machine)."""


class Cells:
    """A session's cells over the ranks of one transport."""

    def __init__(self, transport: CellTransport) -> None:
        self.transport = transport
        self.core = transport.core
        self.core.listener = self
        self.spec = transport.spec
        self.log_dir: Path = self.core.log_dir
        self.run_id = self.core.run_id
        self.names: tuple[str, ...] = ()
        """The names that belong to the ranks (rank 0's, after its last cell)."""
        self.device_bytes: dict[int, int | None] = {}
        """Each rank's GPU memory after its last cell (None without CUDA)."""
        self.lost: str | None = None
        """Why the session ended, once it has (a rank died, a rank could not return)."""
        self.cells_run = 0
        self.note: str | None = None
        """What the last cell changed in the session beyond its state (a new process group)."""
        self._ranks = len(self.core.records)
        self._asked_to_end = False
        self._between: collections.deque[RunEvent] = collections.deque(maxlen=BETWEEN_CELLS)
        self._one_cell = threading.Lock()  # one cell at a time
        first = CellSource(self, 0, None)
        self._cell: CellState | None = CellState(0, first, None, set(range(self._ranks)))
        self.ready = first
        """Cell 0: ends once every rank is idle with its process group."""

    def start(self) -> None:
        """Start the session's ranks (caller thread)."""
        self.transport.start()

    @property
    def alive(self) -> bool:
        """True until the session's ranks are gone (or going)."""
        core = self.core
        return not (core.wait(0) or self._asked_to_end or core.stop_reason is not None)

    def cell(self, payload: Payload, timeout: float | None, debug: bool = False) -> CellSource:
        """Run ``payload`` on every rank as the next cell (any thread, one at a time), stopped after
        ``timeout`` seconds (None: never); ``debug``: a rank that raises opens a debugger first."""
        if not self.alive:
            raise SessionError(f"the session has ended ({self.lost or 'stopped'})")
        if not self._one_cell.acquire(blocking=False):
            raise SessionError(
                "another cell of this session is still running; wait for it (or "
                "interrupt it) before running the next"
            )
        self.cells_run += 1
        source = CellSource(self, self.cells_run, timeout)
        order = self.transport.cell_order(self.cells_run, payload, debug)
        self.core.call_soon(self._begin, source, order)
        return source

    def busy_ranks(self) -> frozenset[int]:
        """The ranks still in the running cell (any thread: a copy)."""
        cell = self._cell
        return frozenset(cell.busy) if cell is not None else frozenset()

    def end(self) -> None:
        """Ask every rank to leave its session loop (it then exits as a finished run)."""
        self._asked_to_end = True
        for rank in range(self._ranks):
            self.core.call_soon(self.transport.send, rank, "end", None)

    def interrupt(self, cell: CellSource, reason: RunStatus) -> None:
        """Interrupt ``cell``'s busy ranks (any thread): ``stop`` of its reader."""
        self.core.call_soon(self._interrupt, cell, reason)

    def cell_stacks(self, cell: CellSource) -> None:
        """Ask ``cell``'s busy ranks for their stacks (any thread); what came of it is in
        the core's records."""
        self.core.call_soon(self._cell_stacks, cell)

    # -- the core's listener (loop thread) --------------------------------------------

    def ending(self) -> None:
        # Before ``Done`` reaches anyone: its reader reads why the session ended.
        self.lost = self.lost or _why_over(self)

    def route(self, event: RunEvent) -> None:
        cell = self._cell
        if isinstance(event, Done):
            # Every rank is gone: the session is over, and with it the cell.
            if cell is not None:
                cell.failures.extend(self.core.failures())
                self._close_cell(cell, RunStatus.STOPPED)
        elif cell is not None:
            cell.source.events.put(event)
        elif not isinstance(event, StateChanged):
            self._between.append(event)  # shown with the next cell

    def message(self, rank: int, kind: str, body: Body) -> None:
        if kind == "cell_done" and isinstance(body, CellReply):
            self._replied(rank, body)
        elif kind == "regrouped":
            self._regrouped(rank, body)

    # -- cells (loop thread) ----------------------------------------------------

    def _begin(self, source: CellSource, order: object) -> None:
        if not self.alive:
            self.transport.send_cell(order, [])
            source.events.put(Notice(f"the session has ended ({self.lost or 'stopped'})"))
            source._finish(RunStatus.STOPPED, None)
            self._one_cell.release()
            return
        ranks = set(range(self._ranks))
        cell = CellState(source.number, source, source.timeout, ranks)
        self.note = None
        self._cell = cell
        while self._between:
            source.events.put(self._between.popleft())
        for rank in sorted(ranks):
            self.transport.log(rank, f"---- nbddp session: cell {cell.number} ----\n")
            source.events.put(StateChanged(rank, RankState.RUNNING))
        self.transport.send_cell(order, sorted(ranks))
        if cell.timeout is not None:
            self.core.later(cell.timeout, self._cell_timeout, cell)

    def _replied(self, rank: int, reply: CellReply) -> None:
        cell = self._cell
        if cell is None or reply.cell != cell.number or rank not in cell.busy:
            return  # a reply to a cell already given up on: the session is ending
        self.transport.drain(rank)  # everything it printed before replying, first
        cell.busy.discard(rank)
        cell.replies[rank] = reply
        if rank == 0:
            self.names = reply.names
        self.device_bytes[rank] = reply.device_bytes
        error = reply.error
        failed = error is not None and not stopped_by_us(reply, cell)
        if failed and error is not None:
            when = local_time(error.raised_at) or time.monotonic()
            cell.failures.append(
                (when, Failure(rank, "raised", error, where=self.transport.where(rank)))
            )
            if len(cell.failures) == 1 and cell.busy:
                self.core.later(self.spec.failure_grace, self._not_returned, cell)
        state = RankState.FAILED if failed else RankState.STOPPED if error else RankState.DONE
        cell.source.events.put(StateChanged(rank, state))
        if not cell.busy:
            if cell.freeing:
                self._regroup(cell)
            else:
                self._close_cell(cell)

    def _close_cell(self, cell: CellState, otherwise: RunStatus = RunStatus.DONE) -> None:
        """``cell`` has ended: its reader learns how (asked to stop, a failure, else
        ``otherwise``), and the next cell may begin."""
        self._cell = None
        cell.ended_at = time.monotonic()
        failed = RunStatus.FAILED if cell.failures else otherwise
        cell.source._finish(cell.reason or failed, cell)
        cell.source.events.put(Done())
        if cell.number > 0:
            self._one_cell.release()

    def _not_returned(self, cell: CellState) -> None:
        """A rank failed ``failure_grace`` ago and others are still busy: interrupt them."""
        if self._cell is not cell or not cell.busy or cell.escalated:
            return
        cell.escalated = True
        busy = ", ".join(map(str, sorted(cell.busy)))
        failed = cell.failures[0][1].rank
        cell.source.events.put(
            Notice(
                f"rank {failed} failed and rank(s) {busy} did not return within "
                f"{self.spec.failure_grace:g}s: interrupting them"
            )
        )
        self._interrupt_busy(cell)

    def _interrupt_busy(self, cell: CellState) -> None:
        for rank in sorted(cell.busy):
            self.transport.send(rank, "interrupt", cell.number)
        self.core.later(INTERRUPT_GRACE, self._give_up, cell)

    def _interrupt(self, cell: CellSource, reason: RunStatus) -> None:
        current = self._cell
        if current is None or current.source is not cell or current.reason is not None:
            return
        current.reason = reason
        if current.number == 0:
            self.core.halt(reason)  # no state to keep yet
            return
        self._interrupt_busy(current)

    def _cell_timeout(self, cell: CellState) -> None:
        if self._cell is not cell or cell.reason is not None:
            return
        if (delay := self.core.waits.put_off()) is not None:
            self.core.later(delay, self._cell_timeout, cell)
            return
        cell.reason = RunStatus.TIMEOUT
        cell.source.events.put(
            Notice(f"timeout of {cell.timeout:g}s reached: dumping stacks, interrupting")
        )
        self._cell_stacks(cell.source)
        self.core.later(STACKS_WAIT, self._interrupt_busy, cell)

    def _cell_stacks(self, source: CellSource) -> None:
        """As a run's (``Job.ask_stacks``), for the ranks still in the cell."""
        cell = self._cell
        if cell is not None and cell.source is source:
            asked = self.transport.ask_stacks(sorted(cell.busy))
            cell.stacks.update(dict.fromkeys(asked, "asked"))

    # -- freeing ranks blocked in a collective (loop thread) ------------------------
    # With gloo, whose peer failed: the ranks close their process group's connections,
    # then every rank joins a new one; else the session ends, saying why.

    def _regroup(self, cell: CellState) -> None:
        """Every rank is free again, their group closed: give them a new one."""
        cell.regrouping = set(range(self._ranks))
        cell.source.events.put(Notice("every rank is free: re-initialising the process group"))
        for rank in sorted(cell.regrouping):
            self.transport.send(rank, "regroup", cell.number)
        self.core.later(REGROUP_WAIT, self._end_session, cell, None)

    def _regrouped(self, rank: int, error: ErrorInfo | None) -> None:
        cell = self._cell
        if cell is None or rank not in cell.regrouping:
            return
        if error is not None:
            self._end_session(cell, f"rank {rank}: {error.type_name}: {error.message}")
            return
        cell.regrouping.discard(rank)
        if not cell.regrouping:
            self.note = REGROUPED
            self._close_cell(cell)

    def _end_session(self, cell: CellState, why: str | None) -> None:
        """The ranks could not be regrouped (``why``; None: not in time), or could not
        be freed (``cell.busy``): the session ends, saying why."""
        if self._cell is not cell:
            return
        if cell.regrouping:
            self.lost = (
                f"the process group could not be re-initialised after freeing the blocked "
                f"ranks ({why or f'not done within {REGROUP_WAIT:g}s'})"
            )
        elif cell.busy:
            busy = ", ".join(map(str, sorted(cell.busy)))
            self.lost = (
                f"rank(s) {busy} did not return to idle within {INTERRUPT_GRACE:g}s of "
                "being interrupted: blocked in a collective, or in C code"
            )
        else:
            return
        cell.source.events.put(Notice(f"{self.lost}; ending the session"))
        self.core.halt(RunStatus.FAILED)

    def _give_up(self, cell: CellState) -> None:
        """Interrupted ranks did not return: with gloo, free them by closing the process
        group's connections (``nbddp.rank.regroup``), once; else end the session."""
        if self._cell is not cell or not cell.busy:
            return
        idle = sorted(set(range(self._ranks)) - cell.busy)
        if self.spec.backend == "gloo" and idle and not cell.freeing and cell.number > 0:
            cell.freeing = True
            busy = ", ".join(map(str, sorted(cell.busy)))
            cell.source.events.put(
                Notice(
                    f"rank(s) {busy} still blocked: closing the process group's connections "
                    "to free them"
                )
            )
            for rank in range(self._ranks):  # the busy ones shut their ends too
                self.transport.send(rank, "close_group", None)
            self.core.later(INTERRUPT_GRACE, self._give_up, cell)
            return
        self._end_session(cell, None)


def _why_over(cells: Cells) -> str:
    """Why the session ended, in words."""
    if cells._asked_to_end:
        return "it was stopped"
    cause = cells.core.root_cause
    if cause is None:
        return f"its ranks were {cells.core.stop_reason or 'stopped'}"
    if cause.kind == "raised" and cause.error is not None:
        return f"rank {cause.rank} raised {cause.error.type_name} outside a cell"
    code = cells.core.outcomes()[cause.rank].exit_code
    verb = "was killed by" if code is not None and code < 0 else "ended with"
    where = cells.transport.where(cause.rank)
    what = (cause.cause or "").rstrip(",") or describe_exit(code) + where
    return f"rank {cause.rank} {verb} {what}"
