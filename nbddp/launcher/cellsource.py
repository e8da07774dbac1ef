"""One session cell as a ``Run`` reads it (``CellSource``: frozen once it ends; ``stop`` and
``dump_stacks`` go to its ``CellOwner``, ``cells.Cells``), and its bookkeeping (``CellState``)."""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from nbddp.launcher.config import JobSpec
from nbddp.launcher.core import RunCore
from nbddp.launcher.events import Failure, RankOutcome, RankState, RunEvent, RunStatus
from nbddp.launcher.failures import root_cause
from nbddp.wire.protocol import Answer, CellReply


class CellOwner(Protocol):
    """What drives the cells (``cells.Cells``), as a cell's reader needs it."""

    core: RunCore
    spec: JobSpec

    def interrupt(self, cell: CellSource, reason: RunStatus) -> None: ...
    def cell_stacks(self, cell: CellSource) -> None: ...


@dataclass
class CellState:
    """One cell's bookkeeping (loop thread), and its reader."""

    number: int
    source: CellSource
    timeout: float | None
    busy: set[int]
    replies: dict[int, CellReply] = field(default_factory=dict)
    failures: list[tuple[float, Failure]] = field(default_factory=list)
    reason: RunStatus | None = None  # INTERRUPTED, STOPPED or TIMEOUT once asked
    escalated: bool = False  # the busy ranks were interrupted after a failure
    freeing: bool = False  # the idle ranks were told to close their group (gloo)
    regrouping: set[int] = field(default_factory=set)  # ranks not yet in the new group
    stacks: dict[int, str] = field(default_factory=dict)  # the ranks asked for their stacks
    started_at: float = field(default_factory=time.monotonic)
    ended_at: float | None = None


def in_cell(record: RankOutcome, cell: CellState | None) -> RankOutcome:
    """A rank's outcome of ``cell`` (None: before any cell began)."""
    if cell is None:
        state = record.state if record.exited else RankState.RUNNING
        return replace(record, state=state, value=None, ended_at=None, stacks=None)
    reply = cell.replies.get(record.rank)
    if reply is not None and not stopped_by_us(reply, cell):
        state = RankState.FAILED if reply.error is not None else RankState.DONE
    else:
        state = record.state if record.exited else RankState.STOPPED
    return replace(
        record,
        state=state,
        value=reply.value if reply is not None else None,
        error=reply.error if reply is not None else record.error,
        started_at=cell.started_at,
        ended_at=cell.ended_at,
        # What became of the stacks this cell asked for is in the job's record.
        stacks=record.stacks if record.rank in cell.stacks else None,
    )


def stopped_by_us(reply: CellReply, cell: CellState) -> bool:
    """True if the rank raised the interrupt the cell was stopped with (not a failure)."""
    error = reply.error
    return bool(cell.reason and error and error.type_name == "builtins.KeyboardInterrupt")


class CellSource:
    """One cell of a session, as a ``Run`` reads it (``run.RunSource``)."""

    def __init__(self, job: CellOwner, number: int, timeout: float | None) -> None:
        self.events: queue.SimpleQueue[RunEvent] = queue.SimpleQueue()
        self.timeout = timeout
        """Seconds before the cell is interrupted (stacks first); None: never."""
        self.number = number
        self.log_dir: Path = job.core.log_dir
        """The session's log directory (one log per rank, a marker line per cell)."""
        self.run_id = f"{job.core.run_id}.{number}"
        """The session's run id and the cell's number."""
        self._job = job
        self._done = threading.Event()
        self._status = RunStatus.RUNNING  # how it ended, once done
        self._cell: CellState | None = None
        self._started_at = time.monotonic()

    def answer(self, rank: int, number: int, text: Answer) -> None:
        self._job.core.answer(rank, number, text)

    def _finish(self, status: RunStatus, cell: CellState | None) -> None:
        """The cell has ended (loop thread)."""
        self._cell = cell
        self._status = status
        self._done.set()

    @property
    def root_cause(self) -> Failure | None:
        """The cell's root-cause failure: the earliest rank that raised, or died."""
        cell = self._cell
        if cell is None:
            return self._job.core.root_cause if self._done.is_set() else None
        return root_cause(cell.failures, self._job.spec.failure_grace)

    @property
    def status(self) -> RunStatus:
        """Running until every rank replied; then done, failed, interrupted, timeout."""
        return self._status if self._done.is_set() else RunStatus.RUNNING

    def outcomes(self) -> tuple[RankOutcome, ...]:
        """Each rank's part in this cell (its value and error)."""
        return tuple(in_cell(record, self._cell) for record in self._job.core.outcomes())

    def wait(self, timeout: float | None = None) -> bool:
        """True once every rank has replied (or the session is gone)."""
        return self._done.wait(timeout)

    def elapsed(self) -> float:
        """Seconds since the cell was sent."""
        cell = self._cell
        end = cell.ended_at if cell is not None and cell.ended_at else time.monotonic()
        return end - self._started_at

    def pids(self) -> dict[int, int]:
        """Rank -> pid (the session's)."""
        return self._job.core.pids()

    def stop(self, reason: RunStatus = RunStatus.STOPPED) -> None:
        """Interrupt the cell on every rank (the session lives on if they return)."""
        self._job.interrupt(self, reason)

    def dump_stacks(self) -> None:
        """Have the ranks still in this cell write their stacks."""
        self._job.cell_stacks(self)
