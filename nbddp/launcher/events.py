"""What a run reports while it goes on, and what each rank came to: typed, immutable.

The job (``launcher.job``) is the only producer: it queues ``RunEvent`` values in order per rank
and ends every run with exactly one ``Done``. Consumers read these, each rank's ``RankOutcome`` and
the root-cause ``Failure``, never the job's bookkeeping; every value is frozen, so any thread may
keep it. ``RankState``/``RunStatus`` are ``str`` enums equal to their words; ``rank_end`` says how
a rank ended in a user's terms (``RankEnd``).
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from enum import Enum
from typing import Literal

from nbddp.wire.descriptors import Packed
from nbddp.wire.protocol import ErrorInfo, MetricRow


class _Word(str, Enum):
    """A state that prints, and shows in a dict (``{0: 'done'}``), as its plain word."""

    def __str__(self) -> str:
        return str(self.value)

    def __repr__(self) -> str:
        return repr(self.value)


class RankState(_Word):
    """Where one rank is; ``rank_end`` refines an ended rank into the later members. A new
    state needs a colour in ``display.blocks``; a live one goes into ``ended``."""

    STARTING = "starting"
    RUNNING = "running"
    WAITING = "waiting for input"
    """At a prompt (``input()``, a debugger): its answer comes from the notebook."""
    DONE = "done"
    FAILED = "failed"
    """Failed by raising an exception (the job: by any failure)."""
    STOPPED = "stopped"
    """Stopped on request (the job: stopped, for whatever reason)."""
    EXITED = "exited"
    """Failed without raising: a non-zero exit code, or killed by a signal."""
    INTERRUPTED = "interrupted"
    """Stopped by a ``KeyboardInterrupt`` in the notebook."""
    TIMED_OUT = "timed out"
    """Stopped because the run passed its ``timeout``."""
    CANCELLED = "cancelled"
    """Stopped because another rank failed (the rest of a run that failed fast)."""

    @property
    def ended(self) -> bool:
        """True once the rank will not change state again."""
        return self not in (RankState.STARTING, RankState.RUNNING, RankState.WAITING)


class RunStatus(_Word):
    """Where a whole run is; the last five are how it ended."""

    STARTING = "starting"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    STOPPED = "stopped"
    """Stopped on request (``Run.stop()``, the panel's Stop)."""
    TIMEOUT = "timeout"
    """Stopped because it ran past its ``timeout``."""
    INTERRUPTED = "interrupted"
    """Stopped by a ``KeyboardInterrupt`` in the notebook."""


@dataclass(frozen=True)
class Text:
    """Decoded text ``rank`` wrote to ``stream`` (``stdout`` or ``stderr``)."""

    rank: int
    stream: str
    text: str


@dataclass(frozen=True)
class StateChanged:
    rank: int
    state: RankState


@dataclass(frozen=True)
class MetricRows:
    """Rows ``rank`` sent with ``nbddp.log``, in the order it logged them."""

    rank: int
    rows: tuple[MetricRow, ...]


@dataclass(frozen=True)
class Notice:
    """A one-line message from nbddp itself (a port fallback, a timeout)."""

    text: str


@dataclass(frozen=True)
class InputAsked:
    """``rank`` waits at a prompt for the user's line (``job.answer`` sends it)."""

    rank: int
    number: int
    prompt: str
    password: bool = False
    """Asked by ``getpass``: ask for a password."""


@dataclass(frozen=True)
class Done:
    """Every rank has exited and all of its output has been read: the last event."""


RunEvent = Text | StateChanged | MetricRows | Notice | InputAsked | Done


StacksTaken = Literal["asked", "written", "signalled"]
"""A rank's stacks: asked for; written; signalled (no answer: a C-level dump was asked for)."""


@dataclass(frozen=True)
class RankOutcome:
    """One rank as the job last saw it; final once ``state.ended`` and the run is done."""

    rank: int
    state: RankState
    pid: int | None
    exit_code: int | None
    """Exit code; negative: killed by that signal; None: still running, or lost."""
    exited: bool
    value: Packed | None
    """Its return value as the rank sent it (``values.unpack`` rebuilds it), once it returned."""
    error: ErrorInfo | None
    """What it raised, once it did."""
    started_at: float
    ended_at: float | None
    """``time.monotonic()`` values."""
    stacks: StacksTaken | None = None
    """What became of its stacks when they were asked for; None: never asked."""


FailureKind = Literal["raised", "exited", "died"]
"""How a rank failed: it raised, it called ``sys.exit`` with a failure, or it
ended without a word (a crash, a signal, ``os._exit``)."""


@dataclass(frozen=True)
class Failure:
    """One rank's failure; the job names the run's root cause among them."""

    rank: int
    kind: FailureKind
    error: ErrorInfo | None = None
    """What it raised, when ``kind`` is ``raised``."""
    cause: str | None = None
    """What ended it, when nbddp knows better than its exit code (its node was lost)."""
    where: str = ""
    """Where it ran, as a message's words (``" on node 1 (10.0.0.3)"``; empty: here)."""


@dataclass(frozen=True)
class RankEnd:
    """How one rank's part in a finished run ended, as the user reads it (``rank_end``)."""

    rank: int
    state: RankState
    """An ended state: done, failed, exited, stopped, interrupted, timed out, cancelled."""
    detail: str = ""
    """The exception's type, the exit (``code 3``, ``SIGKILL``), or the rank that failed."""
    ended_at: float | None = None
    """``time.monotonic()`` when it ended, when known."""


_STOPPED_BY = {
    RunStatus.INTERRUPTED: RankState.INTERRUPTED,
    RunStatus.TIMEOUT: RankState.TIMED_OUT,
    RunStatus.STOPPED: RankState.STOPPED,
}


def rank_end(
    outcome: RankOutcome, status: RunStatus, root: Failure | None, *, stopped_by: bool = False
) -> RankEnd:
    """How ``outcome``'s rank ended, given the run's ended ``status`` and ``root`` cause;
    ``stopped_by``: its failure came only from ``root``'s, so it counts as cancelled."""
    rank, state, ended_at = outcome.rank, outcome.state, outcome.ended_at
    if state is RankState.DONE:
        return RankEnd(rank, RankState.DONE, ended_at=ended_at)
    if state is RankState.FAILED and not (stopped_by and root is not None):
        if outcome.error is not None:
            # A header names the type as the traceback's last line does (not ``builtins.``).
            short = outcome.error.type_name.removeprefix("builtins.")
            return RankEnd(rank, RankState.FAILED, short, ended_at)
        return RankEnd(rank, RankState.EXITED, exit_detail(outcome.exit_code), ended_at)
    if root is not None and root.rank != rank and (stopped_by or status is RunStatus.FAILED):
        return RankEnd(rank, RankState.CANCELLED, f"rank {root.rank} failed", ended_at)
    return RankEnd(rank, _STOPPED_BY.get(status, RankState.STOPPED), ended_at=ended_at)


def exit_detail(code: int | None) -> str:
    """An exit in a header's words: ``code 3``, ``SIGKILL``, or ``an unknown status``."""
    if code is None:
        return "an unknown status"
    if code >= 0:
        return f"code {code}"
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"
