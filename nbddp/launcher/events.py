"""What a run reports while it goes on, and what each rank came to: typed, immutable.

Contract: the job (``launcher.job``) is the only producer. It puts
``RunEvent`` values on its event queue, in the order they happened per
rank, and ends every run with exactly one ``Done``. Consumers (``Run``,
its display, the ``%%ddp`` back end, the panel) read these, each rank's
``RankOutcome`` and the run's root-cause ``Failure``; they never read the
job's own bookkeeping. Every value here is frozen, so a consumer on
another thread can keep it.

States are ``RankState`` and ``RunStatus`` members. Both are ``str``
enums: they compare equal to their names (``RankState.DONE == "done"``),
print as them and cross processes as plain strings. The job reports a
rank as starting, running, done, failed or stopped; once the run is over,
``rank_end`` says how each rank ended in the terms a user reads (it raised,
it exited or was killed, it was stopped on request, by an interrupt, by the
timeout, or because another rank failed), as a ``RankEnd``.
"""

from __future__ import annotations

import signal
from collections.abc import Iterable
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
    """Where one rank is: starting, running, then how it ended.

    The job uses the first five; ``rank_end`` refines an ended rank into the
    others once the run is over. A new live state (a rank waiting for input)
    is one more member here, a colour in ``display.style`` and whatever
    reports it; an ended one also goes into ``_ENDED``.
    """

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
        return self in _ENDED


_ENDED = frozenset(
    (
        RankState.DONE,
        RankState.FAILED,
        RankState.STOPPED,
        RankState.EXITED,
        RankState.INTERRUPTED,
        RankState.TIMED_OUT,
        RankState.CANCELLED,
    )
)


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
    """``rank`` is now in ``state``."""

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


@dataclass(frozen=True)
class Done:
    """Every rank has exited and all of its output has been read: the last event."""


RunEvent = Text | StateChanged | MetricRows | Notice | InputAsked | Done


StacksTaken = Literal["asked", "written", "signalled"]
"""A rank's stacks: asked for and not yet in; written (its Python stacks, the
user's code first); signalled (it did not answer, so faulthandler was asked
for a C-level dump, which a signal handler of the user's own may have taken)."""


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


def run_status(
    ended: bool, states: Iterable[RankState], reason: RunStatus | None, failed: bool
) -> RunStatus:
    """A run's status from its ranks' states while it goes on; once it has ``ended``,
    from how it was stopped (``reason``, None if it was not) and whether a rank
    ``failed``: a failure wins unless the run was stopped for another reason first."""
    if not ended:
        started = any(state is not RankState.STARTING for state in states)
        return RunStatus.RUNNING if started else RunStatus.STARTING
    if failed and reason in (None, RunStatus.FAILED):
        return RunStatus.FAILED
    return reason or RunStatus.DONE


@dataclass(frozen=True)
class RankEnd:
    """How one rank's part in a finished run ended, as the user reads it (``rank_end``)."""

    rank: int
    state: RankState
    """An ended state: done, failed, exited, stopped, interrupted, timed out, cancelled."""
    detail: str = ""
    """What the state alone does not say: the exception's type (``ValueError``), the
    exit (``code 3``, ``SIGKILL``), or the rank whose failure stopped this one."""
    ended_at: float | None = None
    """``time.monotonic()`` when it ended, when known."""
    cause: int | None = None
    """For ``cancelled``: the rank that failed first."""


_STOPPED_BY = {
    RunStatus.INTERRUPTED: RankState.INTERRUPTED,
    RunStatus.TIMEOUT: RankState.TIMED_OUT,
    RunStatus.STOPPED: RankState.STOPPED,
}


def rank_end(
    outcome: RankOutcome, status: RunStatus, root: Failure | None, *, stopped_by: bool = False
) -> RankEnd:
    """How ``outcome``'s rank ended, given how its run ended (``status``, an ended
    ``RunStatus``) and the run's root-cause failure (``root``, if any); ``stopped_by``:
    its failure came only from ``root``'s (``collateral.collateral``: its collective
    broke), so it was cancelled by it like a rank nbddp stopped.

    A rank that failed raised (``failed``, with the exception's type) or did not
    (``exited``, with its exit code or signal). A rank the job stopped, or that
    was still going when the run ended, was stopped for the run's reason:
    interrupted, timed out, stopped on request, or cancelled when another rank
    failed (``cause``: that rank).
    """
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
        return RankEnd(rank, RankState.CANCELLED, f"rank {root.rank} failed", ended_at, root.rank)
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
