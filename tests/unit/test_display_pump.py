"""``Run.wait``'s pump: every queued event reaches the display, in batches, then ``close``."""

from __future__ import annotations

import queue
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from nbddp.launcher.job import RankState
from nbddp.launcher.run import Run


class RecordingDisplay:
    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.refreshes = 0
        self.closed = False
        self.attached: tuple[Path, int] | None = None

    def attach(self, log_dir: Path, world_size: int) -> None:
        self.attached = (log_dir, world_size)

    def output(self, rank: int, stream: str, text: str) -> None:
        self.events.append(("output", rank, stream, text))

    def notice(self, text: str) -> None:
        self.events.append(("notice", text))

    def state(self, rank: int, state: str) -> None:
        self.events.append(("state", rank, state))

    def metric(self, rank: int, row: dict[str, Any]) -> None:
        self.events.append(("metric", rank, row))

    def refresh(self) -> float | None:
        self.refreshes += 1
        return 0.1

    def close(self) -> None:
        self.closed = True


def fake_job(tmp_path: Path) -> Any:
    ranks = [RankState(0), RankState(1)]
    for state in ranks:
        state.exit_code, state.ended_at = 0, 1.0
    return SimpleNamespace(
        events=queue.SimpleQueue(),
        done=threading.Event(),
        ranks=ranks,
        log_dir=tmp_path,
        failure=None,
        stop_reason=None,
        started_at=0.0,
        ended_at=1.0,
        config=SimpleNamespace(kill_grace=1.0, timeout=None),
    )


def test_events_queued_before_wait_all_reach_the_display(tmp_path: Path) -> None:
    job = fake_job(tmp_path)
    display = RecordingDisplay()
    run = Run(job, display)
    assert display.attached == (tmp_path, 2)
    sent = [("output", 0, "stdout", f"line {i}\n") for i in range(100_000)]
    row = {"rank": 1, "step": 0, "time": 0.0, "x": 1.0}
    sent += [("state", 0, "done"), ("metrics", 1, [row, row])]
    for event in sent:
        job.events.put(event)
    job.events.put(("done",))
    job.done.set()
    result = run.wait()
    assert display.events == [*sent[:-1], ("metric", 1, row), ("metric", 1, row)]
    assert display.closed
    assert display.refreshes < 100  # batches, not an event at a time
    assert result.metrics == [row, row]
    assert run.metrics == result.metrics


def test_timeout_refreshes_then_raises(tmp_path: Path) -> None:
    job = fake_job(tmp_path)
    display = RecordingDisplay()
    job.events.put(("output", 0, "stdout", "partial"))
    with pytest.raises(TimeoutError):
        Run(job, display).wait(timeout=0.01)
    assert display.events == [("output", 0, "stdout", "partial")]
    assert display.refreshes >= 1
    assert not display.closed
