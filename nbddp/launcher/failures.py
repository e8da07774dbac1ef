"""The one place that turns how a run failed into the exception the user sees.

Contract: ``root_cause(failures, grace)`` names the failure that ended a
run among those the job saw. ``run_error(cause, status, outcomes, log_dir,
timeout)`` is the
exception a finished run raises (None if it succeeded), built from the
job's typed values only: for a rank that raised, its own exception with its
original type when it can be rebuilt here (once: its large tensors are
mapped from the shared memory they came in, whose descriptors the rebuilt
exception takes; ``release(outcomes)`` closes those of the errors never rebuilt),
else ``RemoteError``; for a rank
that exited or died, ``RankExitedError`` (a signal named by name); for a
run past its timeout, ``LaunchTimeout``; for a stopped run, ``RankError``.
What Python shows is carried by the exception: the rank's traceback as its
``__cause__`` and a note naming the rank and its log.

``presentable(exc, cause, outcomes, log_dir)`` is the same failure as
IPython should show it in a failed cell (the ``%%ddp`` back end): the
rank's own traceback lines once, then "(raised on rank R of N; also
failed: ...; full output in .../rankR.log)", through ``_render_traceback_``;
``rendered(exc, lines)`` attaches such lines to any exception (nbddp's own
classes keep them themselves). ``summary(exc, cause)`` is the failure as the
panel shows it: a headline and the rank's traceback.

Non-goal: ``nbddp.launch`` in a kernel keeps IPython's usual formatting
(the rank's traceback as the cause, then the local frames): only the
``%%ddp`` back end asks for ``presentable``.
"""

from __future__ import annotations

import builtins
import signal
import time
from collections.abc import Sequence
from pathlib import Path

from nbddp.errors import (
    LaunchTimeout,
    NbddpError,
    RankError,
    RankExitedError,
    RemoteError,
    RemoteTraceback,
)
from nbddp.launcher.events import Failure, RankOutcome, RankState, RunStatus
from nbddp.launcher.logs import rank_log
from nbddp.wire.protocol import ErrorInfo
from nbddp.wire.values import unpack

# IPython shows these its own way, ignoring ``_render_traceback_``.
NOT_RENDERED: tuple[type[BaseException], ...] = (
    SyntaxError,
    *((builtins.BaseExceptionGroup,) if hasattr(builtins, "BaseExceptionGroup") else ()),
)


def root_cause(failures: Sequence[tuple[float, Failure]], grace: float) -> Failure | None:
    """The run's root cause among ``(when, failure)``: the earliest, except that a
    rank that died or exited wins over ranks that raised within ``grace`` seconds
    of the first. A raised failure's ``when`` is the rank's own time of it, so a
    rank whose collective broke because another rank raised comes second even when
    the notebook reads its message first.

    Why: a rank that crashes breaks the others' collectives, and their
    "connection reset" errors can reach the notebook in the same instant
    as the news of the crash; a raised error never makes another rank die.
    """
    if not failures:
        return None
    ordered = sorted(failures, key=lambda entry: entry[0])  # stable: ties keep arrival order
    first = ordered[0][0]
    window = [f for when, f in ordered if when - first <= grace]
    return next((f for f in window if f.kind != "raised"), window[0])


def local_time(wall: float | None) -> float | None:
    """A ``time.time()`` stamp of a rank or a node (whose clock is taken to be this
    machine's) on this process's monotonic clock, never later than now; None stays None."""
    if wall is None:
        return None
    now = time.monotonic()
    return min(now, now - (time.time() - wall))


def describe_exit(code: int | None) -> str:
    """ "exit code 3", "signal SIGSEGV (Segmentation fault)", or "an unknown status"."""
    if code is None:
        return "an unknown status (its exit code was lost)"
    if code >= 0:
        return f"exit code {code}"
    try:
        sig = signal.Signals(-code)
    except ValueError:
        return f"signal {-code}"
    return f"signal {sig.name} ({signal.strsignal(sig) or sig.name})"


def run_error(
    cause: Failure | None,
    status: RunStatus,
    outcomes: Sequence[RankOutcome],
    log_dir: Path,
    timeout: float | None,
) -> BaseException | None:
    """The exception a finished run raises, or None if it succeeded (see module contract)."""
    if cause is not None:
        return rank_error(cause, outcomes[cause.rank].exit_code, log_dir)
    if status is RunStatus.TIMEOUT:
        stuck = [o for o in outcomes if o.value is None]
        return LaunchTimeout(
            f"the run exceeded its timeout of {timeout or 0:g}s and was stopped "
            f"with {_ranks([o.rank for o in stuck])} still running; {_where_stacks(stuck, log_dir)}"
        )
    stopped = status in (RunStatus.STOPPED, RunStatus.INTERRUPTED, RunStatus.FAILED)
    if stopped and any(o.value is None for o in outcomes):
        return RankError(f"the run was {status}", rank=-1)
    return None


def _ranks(ranks: Sequence[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def _where_stacks(stuck: Sequence[RankOutcome], log_dir: Path) -> str:
    """Where the stuck ranks' stacks are, or which ones could not be taken and why."""
    written = [o.rank for o in stuck if o.stacks == "written"]
    signalled = [o.rank for o in stuck if o.stacks == "signalled"]
    missing = [o.rank for o in stuck if o.stacks not in ("written", "signalled")]
    parts = []
    if written:
        parts.append(f"the stacks of {_ranks(written)} are in the output and at the end of its log")
    if signalled:
        parts.append(
            f"{_ranks(signalled)} did not answer (a thread held the GIL); a C-level dump "
            "was asked for and is in the log unless the code handles that signal itself"
        )
    if missing:
        parts.append(f"no stacks could be taken from {_ranks(missing)} (it had not started)")
    return "; ".join(parts) + f" (logs in {log_dir})"


def rank_error(cause: Failure, exit_code: int | None, log_dir: Path) -> BaseException:
    """The exception for one rank's failure, carrying its traceback and a note."""
    rank, info = cause.rank, cause.error
    log = str(rank_log(log_dir, rank))
    if info is None:
        what = cause.cause or describe_exit(exit_code)
        verb = "was killed by" if exit_code is not None and exit_code < 0 else "ended with"
        return RankExitedError(
            f"rank {rank} {verb} {what} before returning; its output is in {log}",
            rank=rank,
            exit_code=exit_code,
            log_path=log,
        )
    exc = _rebuilt(info) or remote_error(rank, info, log)
    if isinstance(exc, SystemExit):
        # Only a session's cell sends one (a run's rank exits with the code):
        # the cell ended, the rank did not, and the caller must not exit.
        exc = RankExitedError(
            f"rank {rank} called sys.exit({exc.code!r}) in the cell; in a session that "
            "ends the cell, not the rank",
            rank=rank,
            exit_code=exc.code if isinstance(exc.code, int) else int(exc.code is not None),
            log_path=log,
        )
    exc.__cause__ = RemoteTraceback(f"\n{_traceback_text(rank, info)}")
    if hasattr(exc, "add_note"):  # Python 3.11+
        exc.add_note(f"(raised on rank {rank}; full output in {log})")
    return exc


def remote_error(rank: int, info: ErrorInfo, log: str | None) -> RemoteError:
    """The stand-in for a rank's exception whose type cannot be rebuilt (or shown) here."""
    # rank -1: not a rank's error, an exception that could not carry its rendering.
    return RemoteError(
        f"rank {rank} raised {info.type_name}: {info.message}" if rank >= 0 else info.message,
        rank=rank,
        remote_type=info.type_name,
        remote_traceback=info.traceback,
        log_path=log,
    )


def presentable(
    exc: BaseException,
    cause: Failure | None,
    outcomes: Sequence[RankOutcome],
    log_dir: Path,
    after: Sequence[str] = (),
) -> BaseException:
    """``exc`` (a run's failure) made to show in IPython as the failing rank's traceback, once.

    The lines are the rank's own traceback (formatted in the rank, so they
    show the cell's lines), then which rank it was, which other ranks failed,
    and where the full log is, then ``after`` (what became of a session).
    Exceptions IPython would not render this way (syntax errors, exception
    groups) are replaced by a ``RemoteError``.
    """
    info = cause.error if cause is not None else None
    if cause is None or info is None:
        return rendered(exc, [f"{type(exc).__name__}: {exc}", *after] if after else None)
    rank, log = cause.rank, rank_log(log_dir, cause.rank)
    others = other_failures(outcomes, rank, info)
    also = f"; also failed: {', '.join(others)}" if others else ""
    lines = info.traceback.rstrip("\n").split("\n")
    if isinstance(exc, RankExitedError):  # a session cell's sys.exit (``rank_error``)
        lines.append(f"{type(exc).__name__}: {exc}")
    lines.append(f"(raised on rank {rank} of {len(outcomes)}{also}; full output in {log})")
    lines.extend(after)
    if isinstance(exc, NOT_RENDERED):
        exc = remote_error(rank, info, str(log))
    return rendered(exc, lines)


def other_failures(outcomes: Sequence[RankOutcome], root: int, info: ErrorInfo) -> list[str]:
    """The other failed ranks, each with its error unless it is the root cause's."""
    found: list[str] = []
    for outcome in outcomes:
        if outcome.rank == root or outcome.state is not RankState.FAILED:
            continue
        error = outcome.error
        if error is None:
            found.append(f"rank {outcome.rank} ({describe_exit(outcome.exit_code)})")
        elif (error.type_name, error.message) == (info.type_name, info.message):
            found.append(f"rank {outcome.rank} (the same error)")
        else:
            name = error.type_name.rpartition(".")[2]
            found.append(f"rank {outcome.rank} ({name}: {error.message})")
    return found


def rendered(exc: BaseException, lines: Sequence[str] | None = None) -> BaseException:
    """``exc`` made to show in IPython as ``lines`` (default: its one line), not local frames.

    nbddp's own exceptions keep the lines themselves (``NbddpError.show_as``);
    any other exception gets them as a ``_render_traceback_`` attribute, the
    hook IPython calls instead of formatting the local traceback (the one
    ipyparallel uses for remote errors).
    """
    shown = tuple(lines) if lines is not None else (f"{type(exc).__name__}: {exc}",)
    if isinstance(exc, NbddpError):
        exc.show_as(shown)
        return exc
    try:
        setattr(exc, "_render_traceback_", _Lines(shown))  # noqa: B010  # not a typed attribute
    except AttributeError:  # an exception type without instance attributes
        info = ErrorInfo(type(exc).__qualname__, str(exc), "\n".join(shown), None)
        fallback = remote_error(-1, info, None)
        fallback.show_as(shown)
        return fallback
    return exc


def summary(exc: BaseException, cause: Failure | None) -> tuple[str, str]:
    """The failure as the panel shows it: its headline (with notes) and the rank's traceback."""
    notes = "\n".join(getattr(exc, "__notes__", ()))
    headline = f"{type(exc).__name__}: {exc}\n{notes}".rstrip()
    info = cause.error if cause is not None else None
    detail = _traceback_text(cause.rank, info) if cause is not None and info else ""
    return headline, detail.strip()


class _Lines:
    """A ``_render_traceback_`` for an exception type nbddp does not own: returns its lines."""

    def __init__(self, lines: tuple[str, ...]) -> None:
        self.lines = lines

    def __call__(self) -> list[str]:
        return list(self.lines)


def _rebuilt(info: ErrorInfo) -> BaseException | None:
    """The rank's exception itself, when it rebuilds here (on the shared memory it
    came with: ``values.unpack``, which takes the descriptors, so at most once)."""
    if info.exc is None:
        return None
    try:
        exc = unpack(info.exc)
    except Exception:
        return None
    return exc if isinstance(exc, BaseException) else None


def release(outcomes: Sequence[RankOutcome]) -> None:
    """Close the shared memory of the ranks' exceptions not rebuilt: once a run's
    error is built, no other will be (see module contract)."""
    for outcome in outcomes:
        if outcome.error is not None and outcome.error.exc is not None:
            outcome.error.exc.fds.close()


def _traceback_text(rank: int, info: ErrorInfo) -> str:
    return f"--- traceback from rank {rank} ---\n{info.traceback}"
