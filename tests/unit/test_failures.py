"""``launcher.failures``: the root cause, the exception raised, and how IPython shows it."""

from __future__ import annotations

import signal
import traceback
from pathlib import Path

import pytest

import nbddp
from nbddp.errors import RemoteTraceback
from nbddp.launcher import failures
from nbddp.launcher import failures as collateral
from nbddp.launcher.events import Failure, RankOutcome, RankState, RunStatus
from nbddp.wire import values
from nbddp.wire.descriptors import Descriptors, Packed
from nbddp.wire.protocol import ErrorInfo

TB = 'Traceback (most recent call last):\n  File "<ddp cell [3]>", line 4\nValueError: bad\n'


def info(exc: BaseException | None = None, message: str = "bad") -> ErrorInfo:
    packed = values.pack(exc) if exc is not None else None
    return ErrorInfo("builtins.ValueError", message, TB, packed)


def outcome(
    rank: int,
    state: RankState = RankState.DONE,
    exit_code: int | None = 0,
    error: ErrorInfo | None = None,
    value: bytes | None = None,
) -> RankOutcome:
    return RankOutcome(rank, state, 100 + rank, exit_code, True, value, error, 0.0, 1.0)


def test_the_earliest_failure_is_the_root_cause() -> None:
    a, b = Failure(0, "raised", info()), Failure(1, "raised", info())
    assert failures.root_cause([(10.0, a), (10.1, b)], grace=3.0) == a
    assert failures.root_cause([], grace=3.0) is None


def test_a_rank_that_died_within_the_grace_wins_over_ranks_that_raised() -> None:
    raised, died = Failure(0, "raised", info()), Failure(1, "died")
    assert failures.root_cause([(10.0, raised), (12.0, died)], grace=3.0) == died
    assert failures.root_cause([(10.0, raised), (14.0, died)], grace=3.0) == raised
    exited = Failure(2, "exited")
    assert failures.root_cause([(10.0, raised), (10.5, exited)], grace=3.0) == exited


def test_a_rebuilt_exception_carries_the_ranks_traceback_and_a_note(tmp_path: Path) -> None:
    cause = Failure(1, "raised", info(ValueError("bad")))
    exc = failures.run_error(
        cause, RunStatus.FAILED, [outcome(0), outcome(1, RankState.FAILED, 1)], tmp_path, None
    )
    assert type(exc) is ValueError and str(exc) == "bad"
    assert isinstance(exc.__cause__, RemoteTraceback)
    assert str(exc.__cause__) == f"\n--- traceback from rank 1 ---\n{TB}"
    assert exc.__notes__ == [f"raised on rank 1; full output in {tmp_path / 'rank1.log'}"]
    # What Python prints: the rank's traceback, then the exception with its note.
    printed = "".join(traceback.format_exception(exc))
    assert printed.index('File "<ddp cell [3]>"') < printed.index("raised on rank 1;")


def test_under_a_jupyter_server_the_error_names_the_log_without_its_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # JupyterLab links a path in an error to its debugger ("Start debugger?") unless the
    # file is under its root: there the path is shown under the rank's block instead.
    monkeypatch.setenv("JPY_SESSION_NAME", "train.ipynb")
    cause = Failure(1, "raised", info(ValueError("bad")))
    outcomes = [outcome(0, RankState.STOPPED, -15), outcome(1, RankState.FAILED, 1, cause.error)]
    exc = failures.run_error(cause, RunStatus.FAILED, outcomes, tmp_path, None)
    shown = exc._render_traceback_()  # type: ignore[union-attr]
    assert shown[-1] == "full output in rank1.log, its path under rank 1's block above"
    assert not any(str(tmp_path) in line for line in shown)


def test_launch_fails_in_ipython_as_the_ranks_traceback_keeping_its_type(tmp_path: Path) -> None:
    # nbddp.launch raises what run_error builds: IPython shows the rank's traceback
    # and where its log is, not the notebook frames (nbddp's) that re-raised it.
    cause = Failure(1, "raised", info(ValueError("bad")))
    outcomes = [outcome(0, RankState.STOPPED, -15), outcome(1, RankState.FAILED, 1, cause.error)]
    exc = failures.run_error(cause, RunStatus.FAILED, outcomes, tmp_path, None)
    assert type(exc) is ValueError
    assert exc._render_traceback_() == [  # type: ignore[union-attr]
        *TB.rstrip("\n").split("\n"),
        "raised on rank 1 of 2",
        "rank 0: stopped after rank 1 failed",
        f"full output in {tmp_path / 'rank1.log'}",
    ]


@pytest.mark.parametrize("status", [RunStatus.TIMEOUT, RunStatus.STOPPED])
def test_a_run_that_failed_without_a_ranks_error_shows_one_line(
    tmp_path: Path, status: RunStatus
) -> None:
    exc = failures.run_error(None, status, [outcome(0, RankState.STOPPED, -15)], tmp_path, 1.0)
    assert exc is not None
    assert exc._render_traceback_() == [f"{type(exc).__name__}: {exc}"]  # type: ignore[attr-defined]


@pytest.mark.parametrize("exc", [None, Packed(b"not a pickle", "mymod.Custom", Descriptors())])
def test_an_exception_that_cannot_be_rebuilt_falls_back_to_remote_error(
    tmp_path: Path, exc: Packed | None
) -> None:
    error = ErrorInfo("mymod.Custom", "it broke", TB, exc)
    exc = failures.rank_error(Failure(0, "raised", error), 1, tmp_path)
    assert isinstance(exc, nbddp.RemoteError)
    assert str(exc) == "rank 0 raised mymod.Custom: it broke"
    assert (exc.rank, exc.remote_type, exc.remote_traceback) == (0, "mymod.Custom", TB)
    assert exc.log_path == str(tmp_path / "rank0.log")
    assert isinstance(exc.__cause__, RemoteTraceback)


@pytest.mark.parametrize(
    ("code", "text"),
    [
        (-signal.SIGKILL, "rank 2 was killed by signal SIGKILL (Killed) before returning"),
        (-signal.SIGSEGV, "rank 2 was killed by signal SIGSEGV (Segmentation fault) before"),
        (3, "rank 2 ended with exit code 3 before returning"),
        (None, "rank 2 ended with an unknown status (its exit code was lost)"),
    ],
)
def test_a_rank_that_exited_or_died_names_how(tmp_path: Path, code: int | None, text: str) -> None:
    outcomes = [outcome(0), outcome(1), outcome(2, RankState.FAILED, code)]
    exc = failures.run_error(Failure(2, "died"), RunStatus.FAILED, outcomes, tmp_path, None)
    assert isinstance(exc, nbddp.RankExitedError)
    assert str(exc).startswith(text)
    assert str(exc).endswith(f"its output is in {tmp_path / 'rank2.log'}")
    assert (exc.rank, exc.exit_code) == (2, code)
    with pytest.MonkeyPatch.context() as patch:  # a kernel of a Jupyter server: no path
        patch.setenv("JPY_SESSION_NAME", "train.ipynb")
        shown = "\n".join(exc._render_traceback_())  # type: ignore[attr-defined]
    assert "its output is in rank2.log, its path under rank 2's block above" in shown, shown


def test_a_timeout_names_the_ranks_still_running(tmp_path: Path) -> None:
    outcomes = [outcome(0, value=b"x"), outcome(1, RankState.STOPPED, -15), outcome(2)]
    exc = failures.run_error(None, RunStatus.TIMEOUT, outcomes, tmp_path, 0.5)
    assert isinstance(exc, nbddp.LaunchTimeout)
    assert "timeout of 0.5s and was stopped with ranks 1, 2 still running" in str(exc)


def test_a_stopped_run_fails_unless_every_rank_returned(tmp_path: Path) -> None:
    stopped = [outcome(0, RankState.STOPPED, -15), outcome(1, value=b"x")]
    exc = failures.run_error(None, RunStatus.INTERRUPTED, stopped, tmp_path, None)
    assert isinstance(exc, nbddp.RankError) and str(exc) == "the run was interrupted"
    returned = [outcome(0, value=b"x"), outcome(1, value=b"y")]
    assert failures.run_error(None, RunStatus.STOPPED, returned, tmp_path, None) is None
    assert failures.run_error(None, RunStatus.DONE, stopped, tmp_path, None) is None


def test_ipython_shows_the_ranks_traceback_then_where_and_what_else_failed(
    tmp_path: Path,
) -> None:
    root = info(ValueError("bad"))
    outcomes = [
        outcome(0, RankState.FAILED, 1, info(message="bad")),
        outcome(1, RankState.FAILED, 1, root),
        outcome(2, RankState.FAILED, -9),
        outcome(3, RankState.FAILED, 1, ErrorInfo("torch.DistBackendError", "reset", "", None)),
        outcome(4, RankState.STOPPED, -15),
    ]
    cause = Failure(1, "raised", root)
    exc = failures.run_error(cause, RunStatus.FAILED, outcomes, tmp_path, None)
    assert exc is not None
    shown = failures.presentable(exc, cause, outcomes, tmp_path, ["(the session keeps its state)"])
    assert shown is exc
    lines = shown._render_traceback_()
    assert lines == [
        *TB.rstrip("\n").split("\n"),
        "raised on rank 1 of 5",
        "rank 0: the same error",
        "rank 2: signal SIGKILL (Killed)",
        "rank 3: DistBackendError: reset",
        "rank 4: stopped after rank 1 failed",
        # The path ends its line: it copies as it is.
        f"full output in {tmp_path / 'rank1.log'}",
        "(the session keeps its state)",
    ]


GLOO_CLOSED = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed "
    "by peer [127.0.0.1]:37096. This is typically caused by a remote worker crashing. Check the "
    "logs of the remote worker before reporting an error. GLHF! \U0001f3d6\ufe0f"
)
GLOO_RESET = (
    "[../third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:15278: "
    "Connection reset by peer. This is typically caused by a remote worker hanging or bugs in "
    "the application. Check the logs of the remote worker before reporting an error. GLHF! "
    "\U0001f3d6\ufe0f"
)


@pytest.mark.parametrize(
    ("error", "link"),
    [
        (
            ErrorInfo("builtins.RuntimeError", GLOO_CLOSED, "", None),
            "gloo: connection closed by peer",
        ),
        (
            ErrorInfo("torch.distributed.DistBackendError", GLOO_RESET, "", None),
            "gloo: connection reset by peer",
        ),
        (
            ErrorInfo(
                "torch.distributed.DistBackendError",
                "NCCL error in: ProcessGroupNCCL.cpp:1970, remote process exited or there was "
                "a network error, NCCL version 2.21.5\nncclRemoteError: A call failed",
                "",
                None,
            ),
            "nccl: a remote process exited",
        ),
        (
            ErrorInfo(
                "torch.distributed.DistNetworkError", "failed to recv, got 0 bytes", "", None
            ),
            "torch: the store closed the connection",
        ),
        # A user's own connection errors, and other errors, are their own.
        (
            ErrorInfo(
                "builtins.ConnectionResetError", "[Errno 104] Connection reset by peer", "", None
            ),
            None,
        ),
        (ErrorInfo("builtins.RuntimeError", "gloo: a tensor of the wrong size", "", None), None),
        (None, None),
    ],
)
def test_a_process_group_broken_by_a_peer_is_summarised_in_one_plain_line(
    error: ErrorInfo | None, link: str | None
) -> None:
    assert collateral.broken_link(error) == link


def test_a_rank_that_failed_because_another_did_is_said_to(tmp_path: Path) -> None:
    root = ErrorInfo("builtins.ValueError", "boom", TB, None)
    cause = Failure(1, "raised", root)
    broken = ErrorInfo("builtins.RuntimeError", GLOO_CLOSED, "...", None)
    interrupted = ErrorInfo("builtins.KeyboardInterrupt", "", "...", None)
    own = ErrorInfo("builtins.KeyError", "'w'", "...", None)
    outcomes = [
        outcome(0, RankState.FAILED, 1, broken),
        outcome(1, RankState.FAILED, 1, root),
        outcome(2, RankState.STOPPED, -15),
        outcome(3, RankState.FAILED, 1, interrupted),
        outcome(4, RankState.FAILED, 1, own),
        outcome(5, RankState.DONE, 0),
    ]
    said = [collateral.collateral(o, cause) for o in outcomes]
    assert said == [
        "stopped in a collective after rank 1 failed (gloo: connection closed by peer)",
        None,  # the root cause itself
        "stopped after rank 1 failed",
        "stopped after rank 1 failed",
        None,  # an error of its own
        None,  # it returned
    ]
    assert collateral.collateral(outcomes[0], None) is None  # nothing failed before it
    assert failures.other_failures(outcomes, cause) == [
        "rank 0: stopped in a collective after rank 1 failed (gloo: connection closed by peer)",
        "ranks 2, 3: stopped after rank 1 failed",
        "rank 4: KeyError: 'w'",
    ]


def test_a_backends_message_becomes_one_plain_line() -> None:
    assert collateral.plain(GLOO_CLOSED) == "Connection closed by peer [127.0.0.1]:37096."
    assert collateral.plain("first line\nsecond line") == "first line"
    assert collateral.plain("x" * 500, limit=20) == "x" * 17 + "..."


def test_a_broken_link_is_not_the_root_cause_when_a_rank_raised_its_own_error() -> None:
    # Rank 0's collective broke first by its clock; rank 1's own error is the cause.
    broken = Failure(0, "raised", ErrorInfo("builtins.RuntimeError", GLOO_RESET, "", None))
    own = Failure(1, "raised", info())
    assert failures.root_cause([(10.00, broken), (10.01, own)], grace=3.0) == own
    assert failures.root_cause([(10.00, broken), (14.0, own)], grace=3.0) == broken


def test_a_syntax_error_from_a_rank_is_shown_as_a_remote_error(tmp_path: Path) -> None:
    error = ErrorInfo("builtins.SyntaxError", "invalid syntax", TB, None)
    cause = Failure(0, "raised", error)
    outcomes = [outcome(0, RankState.FAILED, 1, error)]
    shown = failures.presentable(SyntaxError("invalid syntax"), cause, outcomes, tmp_path)
    assert isinstance(shown, nbddp.RemoteError)
    assert str(shown) == "rank 0 raised builtins.SyntaxError: invalid syntax"
    assert shown._render_traceback_()[-2:] == [
        "raised on rank 0 of 1",
        f"full output in {tmp_path / 'rank0.log'}",
    ]


def test_a_failure_without_a_rank_error_shows_as_one_line(tmp_path: Path) -> None:
    exc = nbddp.LaunchTimeout("the run exceeded its timeout")
    shown = failures.presentable(exc, None, [outcome(0)], tmp_path)
    assert shown._render_traceback_() == ["LaunchTimeout: the run exceeded its timeout"]


def test_nbddp_errors_render_only_once_given_lines() -> None:
    exc = nbddp.ConfigError("bad option")
    assert not hasattr(exc, "_render_traceback_")  # IPython formats it as usual
    assert failures.rendered(exc, ["one", "two"]) is exc
    assert exc._render_traceback_() == ["one", "two"]
    assert "_render_traceback_" not in vars(type(exc))  # owned by NbddpError, not patched


def test_an_interrupted_run_says_in_one_line_that_every_rank_was_stopped(tmp_path: Path) -> None:
    exc = failures.interrupted(tmp_path)
    assert isinstance(exc, KeyboardInterrupt)
    assert exc._render_traceback_() == [  # type: ignore[attr-defined]
        f"KeyboardInterrupt: every rank was stopped; their output is in {tmp_path}"
    ]
    starting = failures.interrupted(None)._render_traceback_()  # type: ignore[attr-defined]
    assert starting == [
        "KeyboardInterrupt: interrupted while the ranks were starting; none was left"
    ]


@pytest.mark.parametrize("exc", [ValueError("bad"), nbddp.RankError("bad", rank=1)])
def test_a_note_added_after_the_lines_were_made_is_shown_after_them(exc: Exception) -> None:
    # As a session adds what became of it to the error a run raised.
    exc.add_note("raised on rank 1")
    shown = failures.rendered(exc, ["the rank's traceback", "raised on rank 1"])
    exc.add_note("(every rank returned to idle: the session keeps its state)")
    assert shown._render_traceback_() == [  # type: ignore[attr-defined]
        "the rank's traceback",
        "raised on rank 1",
        "(every rank returned to idle: the session keeps its state)",
    ]
    fresh = failures.rendered(KeyError("k"), ["KeyError: 'k'"])
    fresh.add_note("later")
    assert fresh._render_traceback_() == ["KeyError: 'k'", "later"]  # type: ignore[attr-defined]


def test_other_exceptions_get_a_rendering_callable() -> None:
    exc = failures.rendered(KeyboardInterrupt(), ["KeyboardInterrupt: every rank was stopped"])
    assert isinstance(exc, KeyboardInterrupt)
    assert exc._render_traceback_() == ["KeyboardInterrupt: every rank was stopped"]
    plain = failures.rendered(ValueError("x"))
    assert plain._render_traceback_() == ["ValueError: x"]


def test_the_panel_summary_has_the_headline_notes_and_the_ranks_traceback(
    tmp_path: Path,
) -> None:
    cause = Failure(1, "raised", info(ValueError("bad")))
    exc = failures.rank_error(cause, 1, tmp_path)
    headline, detail = failures.summary(exc, cause)
    assert headline == f"ValueError: bad\nraised on rank 1; full output in {tmp_path / 'rank1.log'}"
    assert detail == f"--- traceback from rank 1 ---\n{TB.strip()}"
    assert failures.summary(nbddp.LaunchTimeout("late"), None) == ("LaunchTimeout: late", "")


def test_states_print_as_the_plain_strings_users_saw() -> None:
    from nbddp.launcher.events import RankState, RunStatus

    assert repr({0: RankState.STOPPED, 1: RankState.DONE}) == "{0: 'stopped', 1: 'done'}"
    assert f"{RunStatus.TIMEOUT}" == str(RunStatus.TIMEOUT) == "timeout"
    assert RankState.DONE == "done" and RankState("failed") is RankState.FAILED


def test_a_timeout_says_where_each_ranks_stacks_are_or_why_there_are_none(
    tmp_path: Path,
) -> None:
    from dataclasses import replace

    outcomes = [
        replace(outcome(0, RankState.STOPPED, -15), stacks="written"),
        replace(outcome(1, RankState.STOPPED, -15), stacks="signalled"),
        outcome(2, RankState.STOPPED, -15),
    ]
    text = str(failures.run_error(None, RunStatus.TIMEOUT, outcomes, tmp_path, 2.0))
    assert "the stacks of rank 0 are in the output and at the end of its log" in text
    assert "rank 1 did not answer (a thread held the GIL); a C-level dump was asked for" in text
    assert "no stacks could be taken from rank 2" in text
    assert text.endswith(f"; logs in {tmp_path}")  # the path ends it: it copies as it is


def test_the_rank_that_raised_first_is_the_root_cause_whatever_order_its_news_arrives_in() -> None:
    # Rank 1 raised; rank 0's collective broke because of it a moment later, but the
    # notebook read rank 0's message first (both came in one read of the relay).
    collateral, cause = Failure(0, "raised", info()), Failure(1, "raised", info())
    assert failures.root_cause([(10.02, collateral), (10.01, cause)], grace=3.0) == cause
    assert failures.root_cause([(10.0, collateral), (10.0, cause)], grace=3.0) == collateral


def test_a_ranks_error_carries_when_it_reached_the_worker() -> None:
    import time

    from nbddp.launcher.failures import local_time
    from nbddp.rank.errors import error_info

    before = time.time()
    stamp = error_info(ValueError("boom")).raised_at
    assert stamp is not None and before <= stamp <= time.time()
    # On the notebook's monotonic clock: a second ago is a second ago, never in the future.
    assert abs(local_time(time.time() - 1.0) - (time.monotonic() - 1.0)) < 0.05  # type: ignore[operator]
    assert local_time(time.time() + 5.0) <= time.monotonic()  # type: ignore[operator]
    assert local_time(None) is None
