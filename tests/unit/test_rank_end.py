"""How a rank's end is told: ``events.rank_end`` and ``style.state_words``."""

from __future__ import annotations

import pytest

from nbddp.display.blocks import STATE_COLORS, state_words
from nbddp.launcher.events import (
    Failure,
    RankOutcome,
    RankState,
    RunStatus,
    exit_detail,
    rank_end,
)
from nbddp.wire.protocol import ErrorInfo

RAISED = ErrorInfo(type_name="builtins.ValueError", message="no", traceback="", exc=None)


def outcome(rank: int, state: RankState, *, error: bool = False, code: int = 0) -> RankOutcome:
    return RankOutcome(
        rank=rank,
        state=state,
        pid=None,
        exit_code=code,
        exited=True,
        value=None,
        error=RAISED if error else None,
        started_at=0.0,
        ended_at=2.0,
    )


def test_a_rank_that_raised_is_failed_with_the_exceptions_type() -> None:
    end = rank_end(outcome(1, RankState.FAILED, error=True), RunStatus.FAILED, None)
    assert (end.state, end.detail, end.ended_at) == (RankState.FAILED, "ValueError", 2.0)
    assert state_words(end.state, end.detail) == "failed: ValueError"


@pytest.mark.parametrize(
    ("code", "words"), [(3, "exited with code 3"), (-9, "killed by SIGKILL"), (-200, None)]
)
def test_a_rank_that_failed_without_raising_exited(code: int, words: str | None) -> None:
    end = rank_end(outcome(0, RankState.FAILED, code=code), RunStatus.FAILED, None)
    assert end.state is RankState.EXITED
    if words is not None:
        assert state_words(end.state, end.detail) == words
    else:
        assert end.detail == "signal 200"


def test_the_ranks_stopped_because_another_failed_are_cancelled_by_it() -> None:
    root = Failure(rank=1, kind="raised", error=RAISED)
    end = rank_end(outcome(0, RankState.STOPPED), RunStatus.FAILED, root)
    assert end.state is RankState.CANCELLED
    assert state_words(end.state, end.detail) == "stopped: rank 1 failed"
    assert STATE_COLORS[RankState.CANCELLED] != STATE_COLORS[RankState.FAILED]


@pytest.mark.parametrize(
    ("status", "state"),
    [
        (RunStatus.INTERRUPTED, RankState.INTERRUPTED),
        (RunStatus.TIMEOUT, RankState.TIMED_OUT),
        (RunStatus.STOPPED, RankState.STOPPED),
    ],
)
def test_a_stopped_or_still_running_rank_takes_the_runs_reason(
    status: RunStatus, state: RankState
) -> None:
    for was in (RankState.STOPPED, RankState.RUNNING):
        end = rank_end(outcome(0, was), status, None)
        assert end.state is state and state.ended
        assert state_words(end.state, end.detail) == state.value


def test_exit_detail_without_a_code() -> None:
    assert exit_detail(None) == "an unknown status"
