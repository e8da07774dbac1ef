"""``Run.wait``'s pump: every queued event reaches the display, in batches, then ``close``."""

from __future__ import annotations

import queue
import threading
from pathlib import Path

import pytest

import nbddp
from nbddp.launcher.config import JobSpec, LaunchConfig
from nbddp.launcher.events import (
    Done,
    Failure,
    MetricRows,
    Notice,
    RankOutcome,
    RankState,
    RunEvent,
    RunStatus,
    StateChanged,
    Text,
)
from nbddp.launcher.run import Run
from tests.displays import RecordingDisplay

CONFIG = LaunchConfig(JobSpec(world_size=2, device="cpu", kill_grace=1.0))
"""What a ``Run`` reads of its launch's options here: the grace to stop, no timeout."""


class FakeSource:
    """Only what a ``Run`` reads: the event queue, outcomes, root cause, status, end."""

    def __init__(self, log_dir: Path) -> None:
        self.events: queue.SimpleQueue[RunEvent] = queue.SimpleQueue()
        self.log_dir = log_dir
        self.ended = threading.Event()
        self.root_cause: Failure | None = None
        self.status = RunStatus.DONE
        self.ranks = [
            RankOutcome(r, RankState.DONE, 100 + r, 0, True, None, None, 0.0, 1.0) for r in (0, 1)
        ]

    def outcomes(self) -> tuple[RankOutcome, ...]:
        return tuple(self.ranks)

    def wait(self, timeout: float | None = None) -> bool:
        return self.ended.wait(timeout)

    def elapsed(self) -> float:
        return 1.0


def test_events_queued_before_wait_all_reach_the_display(tmp_path: Path) -> None:
    job = FakeSource(tmp_path)
    display = RecordingDisplay()
    run = Run(job, display, CONFIG)
    assert display.attached == (tmp_path, 2)
    sent: list[RunEvent] = [Text(0, "stdout", f"line {i}\n") for i in range(100_000)]
    row = {"rank": 1, "step": 0, "time": 0.0, "x": 1.0}
    sent += [StateChanged(0, RankState.DONE), Notice("a notice"), MetricRows(1, (row, row))]
    for event in sent:
        job.events.put(event)
    job.events.put(Done())
    job.ended.set()
    result = run.wait()
    expected = [("output", 0, "stdout", f"line {i}\n") for i in range(100_000)]
    expected += [("state", 0, "done"), ("notice", "a notice")]
    ends = [("state", 0, "done"), ("state", 1, "done")]  # how each ended, once it is over
    assert display.events == [*expected, ("metric", 1, row), ("metric", 1, row), *ends]
    assert display.closed
    assert display.refreshes < 100  # batches, not an event at a time
    assert result.metrics == [row, row]
    assert run.metrics == result.metrics
    assert result.failure is None and result.duration == 1.0
    assert result.exit_codes == {0: 0, 1: 0}


def test_timeout_refreshes_then_raises(tmp_path: Path) -> None:
    job = FakeSource(tmp_path)
    display = RecordingDisplay()
    job.events.put(Text(0, "stdout", "partial"))
    with pytest.raises(TimeoutError):
        Run(job, display, CONFIG).wait(timeout=0.01)
    assert display.events == [("output", 0, "stdout", "partial")]
    assert display.refreshes >= 1
    assert not display.closed


def test_the_root_cause_and_outcomes_make_the_error_raised(tmp_path: Path) -> None:
    job = FakeSource(tmp_path)
    job.ranks[1] = RankOutcome(1, RankState.FAILED, 101, -11, True, None, None, 0.0, 1.0)
    job.root_cause = Failure(1, "died")
    job.status = RunStatus.FAILED
    job.events.put(Done())
    job.ended.set()
    run = Run(job, None, CONFIG)
    with pytest.raises(nbddp.RankExitedError, match=r"rank 1 was killed by signal SIGSEGV") as info:
        run.wait()
    assert info.value.exit_code == -11 and info.value.rank == 1
    assert info.value.log_path == str(tmp_path / "rank1.log")
    assert run.status == "failed" and run.rank_states() == {0: "done", 1: "failed"}
