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
print as them and cross processes as plain strings.
"""

from __future__ import annotations

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
    """Where one rank is: starting, running, then done, failed or stopped."""

    STARTING = "starting"
    RUNNING = "running"
    WAITING = "waiting for input"
    """At a prompt (``input()``, a debugger): its answer comes from the notebook."""
    DONE = "done"
    FAILED = "failed"
    STOPPED = "stopped"

    @property
    def ended(self) -> bool:
        """True once the rank will not change state again."""
        return self in _ENDED


_ENDED = frozenset((RankState.DONE, RankState.FAILED, RankState.STOPPED))


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
