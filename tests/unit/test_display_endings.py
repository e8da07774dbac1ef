"""How a run's display ends: a rank that failed only because another did is shown as
stopped, not failed like the rank that raised; an interrupted run's display shows each
rank as it ended, not as it last ran."""

from __future__ import annotations

from pathlib import Path

import pytest

from nbddp.errors import RemoteError
from nbddp.launcher.events import Done, Failure, RankOutcome, RankState, StateChanged
from nbddp.launcher.run import Run, RunStatus
from nbddp.wire.protocol import ErrorInfo
from tests.displays import RecordingDisplay
from tests.unit.test_display_pump import CONFIG, FakeSource

RAISED = ErrorInfo("builtins.ValueError", "bad batch", "Traceback ...\nValueError: bad\n", None)
BROKEN = ErrorInfo(
    "builtins.RuntimeError",
    "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer",
    "Traceback ...\nRuntimeError: ...\n",
    None,
)


def failed(rank: int, error: ErrorInfo) -> RankOutcome:
    return RankOutcome(rank, RankState.FAILED, 100 + rank, 1, True, None, error, 0.0, 1.0)


def failed_job(tmp_path: Path, *ranks: RankOutcome) -> FakeSource:
    """A job that has ended failed, rank 1's error its root cause, its ranks ``ranks``:
    every rank's failed state and its end queued."""
    job = FakeSource(tmp_path)
    job.ranks = list(ranks)
    job.root_cause = Failure(1, "raised", error=RAISED)
    job.status = RunStatus.FAILED
    for rank in (0, 1):
        job.events.put(StateChanged(rank, RankState.FAILED))
    job.events.put(Done())
    job.ended.set()
    return job


def test_a_rank_whose_collective_broke_after_another_failed_is_shown_stopped(
    tmp_path: Path,
) -> None:
    job = failed_job(tmp_path, failed(0, BROKEN), failed(1, RAISED))
    display = RecordingDisplay()
    with pytest.raises(RemoteError, match="bad batch"):
        Run(job, display, CONFIG).wait()
    assert display.events == [
        ("state", 0, "failed"),
        ("state", 1, "failed"),
        ("state", 0, "cancelled"),  # how each ended: rank 0 stopped by rank 1's failure
        ("state", 1, "failed"),
    ]
    assert display.closed


def test_a_rank_that_failed_on_its_own_keeps_its_failed_state(tmp_path: Path) -> None:
    job = failed_job(tmp_path, failed(0, RAISED), failed(1, RAISED))
    display = RecordingDisplay()
    with pytest.raises(RemoteError, match="bad batch"):
        Run(job, display, CONFIG).wait()
    ends = [("state", 0, "failed"), ("state", 1, "failed")]  # how each ended: as it was
    assert display.events == [("state", 0, "failed"), ("state", 1, "failed"), *ends]


class InterruptedSource(FakeSource):
    """A job whose first wait is interrupted; stopping it ends every rank."""

    def __init__(self, log_dir: Path) -> None:
        super().__init__(log_dir)
        self.status = RunStatus.INTERRUPTED
        self.waits = 0

    def wait(self, timeout: float | None = None) -> bool:
        self.waits += 1
        if self.waits == 1:
            raise KeyboardInterrupt
        return super().wait(timeout)

    def stop(self, reason: RunStatus = RunStatus.STOPPED) -> None:
        for rank in (0, 1):
            self.ranks[rank] = RankOutcome(
                rank, RankState.STOPPED, 100 + rank, -15, True, None, None, 0.0, 1.0
            )
            self.events.put(StateChanged(rank, RankState.STOPPED))
        self.events.put(Done())
        self.ended.set()


def test_an_interrupted_runs_display_shows_each_rank_as_it_ended(tmp_path: Path) -> None:
    job = InterruptedSource(tmp_path)
    display = RecordingDisplay()
    run = Run(job, display, CONFIG)
    for rank in (0, 1):
        job.events.put(StateChanged(rank, RankState.RUNNING))
    with pytest.raises(KeyboardInterrupt):
        run.wait()
    states = [event for event in display.events if event[0] == "state"]
    assert states[-2:] == [("state", 0, "interrupted"), ("state", 1, "interrupted")]
    assert display.closed
