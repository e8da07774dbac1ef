"""The one place that turns how a run failed into the exception the user sees.

``root_cause`` names the failure that ended a run; ``run_error`` is the exception a finished run
raises (None if it succeeded): a rank's own exception with its original type when it rebuilds here
(once; ``release`` closes the shared memory of those never rebuilt), else ``RemoteError``;
``RankExitedError`` for a rank that exited or died, ``LaunchTimeout``, or ``RankError`` for a
stopped run. ``presentable``/``rendered`` make it show in IPython as the rank's own traceback, its
rank and its log, with no frame of nbddp's; ``summary`` is the failure as the panel shows it.

What became of the other ranks is said in plain words (``collateral``, ``broken_link``,
``plain``), pure over the job's typed values; the backend's own text stays in the rank's log.
"""

from __future__ import annotations

import builtins
import re
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
    ShownLines,
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


def collateral(outcome: RankOutcome, cause: Failure | None) -> str | None:
    """Why ``outcome``'s rank failed only because ``cause``'s did (``stopped after rank 1
    failed``): stopped or interrupted by nbddp, or its link to a peer broke; else None."""
    if cause is None or outcome.rank == cause.rank:
        return None
    after = f"after rank {cause.rank} failed"
    if outcome.state is RankState.STOPPED:
        return f"stopped {after}"
    error = outcome.error
    if outcome.state is not RankState.FAILED or error is None:
        return None
    if error.type_name == "builtins.KeyboardInterrupt":
        return f"stopped {after}"
    link = broken_link(error)
    if link is None:
        return None
    where = "in a collective " if link.partition(":")[0] in _COLLECTIVES else ""
    return f"stopped {where}{after} ({link})"


_COLLECTIVES = ("gloo", "nccl")
_BROKEN = (
    ("connection closed by peer", re.compile(r"connection closed by peer", re.I)),
    ("connection reset by peer", re.compile(r"connection reset by peer", re.I)),
    ("broken pipe", re.compile(r"broken pipe", re.I)),
    ("a peer closed the connection", re.compile(r"pair closure|socket closed", re.I)),
    ("a remote process exited", re.compile(r"remote process exited|ncclRemoteError", re.I)),
    ("communicator aborted", re.compile(r"communicator was aborted|NCCL.*abort", re.I)),
    ("could not connect to the other ranks", re.compile(r"connectFullMesh failed", re.I)),
    ("the store closed the connection", re.compile(r"failed to recv, got 0 bytes", re.I)),
)
"""What a peer's end does to a rank's process group or store: plain words, the backend's."""


def broken_link(error: ErrorInfo | None) -> str | None:
    """``gloo: connection closed by peer`` for a process group's or store's error when a
    peer is gone; None for any other (a user's own ``ConnectionResetError`` included)."""
    if error is None:
        return None
    text = error.message
    lowered = text.lower()
    backend = next((name for name in _COLLECTIVES if name in lowered), None)
    if backend is None and error.type_name.startswith("torch."):
        backend = "store" if "store" in lowered or "Store" in error.type_name else "torch"
    if backend is None:
        return None
    words = next((words for words, pattern in _BROKEN if pattern.search(text)), None)
    return f"{backend}: {words}" if words is not None else None


_SOURCE_PLACE = re.compile(r"\[[^\]\s]*/[^\]\s]*:\d+\]\s*")
"""``[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553]``"""
_NOT_PLAIN = re.compile(r"[^\x20-\x7e\u00a0-\u024f\u2010-\u2027]+")
"""Controls, emoji and other symbols (Latin letters and common punctuation stay)."""
_CHATTER = re.compile(r"\s*(GLHF!?|This is typically caused by[^.]*\.|Check the logs of[^.]*\.)")


def plain(message: str, limit: int = 160) -> str:
    """``message``'s first line without source places, emoji or sign-off, cut to ``limit``."""
    first = next((line for line in message.splitlines() if line.strip()), "")
    text = _CHATTER.sub("", _SOURCE_PLACE.sub("", first))
    text = " ".join(_NOT_PLAIN.sub(" ", text).split())
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def root_cause(failures: Sequence[tuple[float, Failure]], grace: float) -> Failure | None:
    """The run's root cause among ``(when, failure)``: the earliest, except that within ``grace``
    seconds of it a rank that died or exited comes first, and a connection broken by a peer
    (``broken_link``) last: a crash breaks the others' collectives in the same instant."""
    if not failures:
        return None
    ordered = sorted(failures, key=lambda entry: entry[0])  # stable: ties keep arrival order
    first = ordered[0][0]
    window = [f for when, f in ordered if when - first <= grace]
    ended = next((f for f in window if f.kind != "raised"), None)
    own = next((f for f in window if broken_link(f.error) is None), None)
    return ended or own or window[0]


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
    """The exception a finished run raises (None if it succeeded), shown as ``presentable``."""
    error: BaseException | None = None
    if cause is not None:
        error = rank_error(cause, outcomes[cause.rank].exit_code, log_dir)
    elif status is RunStatus.TIMEOUT:
        stuck = [o for o in outcomes if o.value is None]
        error = LaunchTimeout(
            f"the run exceeded its timeout of {timeout or 0:g}s and was stopped "
            f"with {who([o.rank for o in stuck])} still running; {_where_stacks(stuck, log_dir)}"
        )
    elif status in (RunStatus.STOPPED, RunStatus.INTERRUPTED, RunStatus.FAILED) and any(
        o.value is None for o in outcomes
    ):
        error = RankError(f"the run was {status}", rank=-1)
    if error is None or isinstance(error, NOT_RENDERED):
        return error  # IPython shows those its own way
    shown = presentable(error, cause, outcomes, log_dir)
    return shown if shown is error else error  # never another type than the rank's


def who(ranks: Sequence[int]) -> str:
    """``rank 3`` or ``ranks 0, 2``: who, in words."""
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def _where_stacks(stuck: Sequence[RankOutcome], log_dir: Path) -> str:
    written = [o.rank for o in stuck if o.stacks == "written"]
    signalled = [o.rank for o in stuck if o.stacks == "signalled"]
    missing = [o.rank for o in stuck if o.stacks not in ("written", "signalled")]
    parts = []
    if written:
        parts.append(f"the stacks of {who(written)} are in the output and at the end of its log")
    if signalled:
        parts.append(
            f"{who(signalled)} did not answer (a thread held the GIL); a C-level dump "
            "was asked for and is in the log unless the code handles that signal itself"
        )
    if missing:
        parts.append(f"no stacks could be taken from {who(missing)} (it had not started)")
    return "; ".join(parts) + f"; logs in {log_dir}"


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
        exc.add_note(f"raised on rank {rank}; full output in {log}")
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
    """``exc`` made to show in IPython as the rank's own traceback, its rank, what became
    of the others, its log, then ``after``; a ``NOT_RENDERED`` type becomes ``RemoteError``."""
    info = cause.error if cause is not None else None
    if cause is None or info is None:
        lines = [f"{type(exc).__name__}: {exc}"]
        if cause is not None:  # a rank that exited or died: what became of the others
            lines.extend(other_failures(outcomes, cause))
        return rendered(exc, [*lines, *after] if len(lines) > 1 or after else None)
    rank, log = cause.rank, rank_log(log_dir, cause.rank)
    lines = info.traceback.rstrip("\n").split("\n")
    if isinstance(exc, RankExitedError):  # a session cell's sys.exit (``rank_error``)
        lines.append(f"{type(exc).__name__}: {exc}")
    lines += [f"raised on rank {rank} of {len(outcomes)}{cause.where}"]
    lines += [*other_failures(outcomes, cause), f"full output in {log}", *after]
    if isinstance(exc, NOT_RENDERED):
        exc = remote_error(rank, info, str(log))
    return rendered(exc, lines)


def other_failures(outcomes: Sequence[RankOutcome], cause: Failure) -> list[str]:
    """A line per group of other ranks that failed or were stopped (``ranks 2, 3: ...``)."""
    said: dict[str, list[int]] = {}
    for outcome in outcomes:
        if outcome.rank == cause.rank:
            continue
        what = collateral(outcome, cause) or _own_failure(outcome, cause)
        if what is not None:
            said.setdefault(what, []).append(outcome.rank)
    return [f"{who(ranks)}: {what}" for what, ranks in said.items()]


def _own_failure(outcome: RankOutcome, cause: Failure) -> str | None:
    """What a rank that failed on its own account came to; None if it did not fail."""
    if outcome.state is not RankState.FAILED:
        return None
    error, info = outcome.error, cause.error
    if error is None:
        return describe_exit(outcome.exit_code)
    if info is not None and (error.type_name, error.message) == (info.type_name, info.message):
        return "the same error"
    return f"{error.type_name.rpartition('.')[2]}: {plain(error.message)}"


def rendered(exc: BaseException, lines: Sequence[str] | None = None) -> BaseException:
    """``exc`` made to show in IPython as ``lines`` (default: its one line), not local frames."""
    shown = tuple(lines) if lines is not None else (f"{type(exc).__name__}: {exc}",)
    if isinstance(exc, NbddpError):
        exc.show_as(shown)
        return exc
    try:
        setattr(exc, "_render_traceback_", ShownLines(exc, shown))  # noqa: B010  # untyped
    except AttributeError:  # an exception type without instance attributes
        info = ErrorInfo(type(exc).__qualname__, str(exc), "\n".join(shown), None)
        fallback = remote_error(-1, info, None)
        fallback.show_as(shown)
        return fallback
    return exc


def by_a_rank(exc: BaseException) -> bool:
    """Whether ``exc`` is a rank's own exception raised here (``rank_error``), not an
    interrupt of the notebook's (a rank's ``KeyboardInterrupt`` keeps its message)."""
    return isinstance(exc.__cause__, RemoteTraceback)


def interrupted_line(log_dir: Path | None) -> str:
    """The one line an interrupted run shows (``log_dir`` None: it was still starting)."""
    if log_dir is None:
        return "KeyboardInterrupt: interrupted while the ranks were starting; none was left"
    return f"KeyboardInterrupt: every rank was stopped; their output is in {log_dir}"


def interrupted(log_dir: Path | None) -> BaseException:
    """The ``KeyboardInterrupt`` of a run an interrupt stopped, shown as ``interrupted_line``."""
    return rendered(KeyboardInterrupt(), [interrupted_line(log_dir)])


def summary(exc: BaseException, cause: Failure | None) -> tuple[str, str]:
    """The failure as the panel shows it: its headline (with notes) and the rank's traceback."""
    notes = "\n".join(getattr(exc, "__notes__", ()))
    headline = f"{type(exc).__name__}: {exc}\n{notes}".rstrip()
    info = cause.error if cause is not None else None
    detail = _traceback_text(cause.rank, info) if cause is not None and info else ""
    return headline, detail.strip()


def _rebuilt(info: ErrorInfo) -> BaseException | None:
    """The rank's exception itself, when it rebuilds here (at most once: it takes the fds)."""
    if info.exc is None:
        return None
    try:
        exc = unpack(info.exc)
    except Exception:
        return None
    return exc if isinstance(exc, BaseException) else None


def release(outcomes: Sequence[RankOutcome]) -> None:
    """Close the shared memory of the ranks' exceptions not rebuilt (after ``run_error``)."""
    for outcome in outcomes:
        if outcome.error is not None and outcome.error.exc is not None:
            outcome.error.exc.fds.close()


def _traceback_text(rank: int, info: ErrorInfo) -> str:
    return f"--- traceback from rank {rank} ---\n{info.traceback}"
