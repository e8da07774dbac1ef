"""A display that raises never breaks a run: inside its guard (``display.guard``, which
every launch's display has), the error is reported once, the rest of the run is shown
as text, and ``Run.wait`` returns the run's own result."""

from __future__ import annotations

from pathlib import Path

import pytest

from nbddp.display.guard import Guarded
from nbddp.launcher.events import Done, MetricRows, Notice, RankState, StateChanged, Text
from nbddp.launcher.run import Run, RunStatus
from tests.displays import RecordingDisplay
from tests.unit.test_display_pump import CONFIG, FakeSource


class Broken(RecordingDisplay):
    """Raises ``error`` from the method named ``where`` (every call)."""

    def __init__(self, where: str, error: BaseException) -> None:
        super().__init__()
        self.where = where
        self.error = error
        self.calls = 0

    def _maybe(self, name: str) -> None:
        if name == self.where:
            self.calls += 1
            raise self.error

    def attach(self, log_dir: Path, world_size: int) -> None:
        self._maybe("attach")
        super().attach(log_dir, world_size)

    def output(self, rank: int, stream: str, text: str) -> None:
        self._maybe("output")
        super().output(rank, stream, text)

    def metric(self, rank: int, row: dict[str, object]) -> None:
        self._maybe("metric")
        super().metric(rank, row)

    def refresh(self) -> float | None:
        self._maybe("refresh")
        return super().refresh()

    def close(self) -> None:
        self._maybe("close")
        super().close()


class StoppableSource(FakeSource):
    def __init__(self, log_dir: Path) -> None:
        super().__init__(log_dir)
        self.stopped: list[RunStatus] = []

    def stop(self, reason: RunStatus = RunStatus.STOPPED) -> None:
        self.stopped.append(reason)
        self.events.put(Done())
        self.ended.set()


def finish(run: Run, job: FakeSource) -> None:
    """Two lines, then (after a wait that times out, so the display refreshes) a
    metric row, a state, a last line and the end."""
    for rank in (0, 1):
        job.events.put(Text(rank, "stdout", f"line {rank}\n"))
    with pytest.raises(TimeoutError):
        run.wait(timeout=0.01)
    row = {"rank": 1, "step": 0, "time": 0.0, "x": 1.0}
    job.events.put(MetricRows(1, (row,)))
    job.events.put(StateChanged(0, RankState.DONE))
    job.events.put(Text(0, "stdout", "the last line\n"))
    job.events.put(Done())
    job.ended.set()


@pytest.mark.parametrize("where", ["attach", "output", "metric", "refresh", "close"])
def test_a_display_error_is_reported_once_and_the_run_goes_on_as_text(
    tmp_path: Path, where: str, capsys: pytest.CaptureFixture[str]
) -> None:
    job = FakeSource(tmp_path)
    display = Broken(where, MemoryError())
    run = Run(job, Guarded(display, None), CONFIG)
    finish(run, job)
    result = run.wait()
    assert result.failure is None and result.exit_codes == {0: 0, 1: 0}
    assert len(result.metrics) == 1  # recorded once, whatever the display did
    assert display.calls == 1  # a failed display is not called again
    out, err = capsys.readouterr()
    assert err.count("nbddp: the display failed (MemoryError)") == 1, err
    assert "showing the rest of this run as text" in err
    assert str(tmp_path) in err  # where everything is kept
    if where != "close":
        assert "[rank 0] the last line\n" in out
    else:
        assert out == ""


def test_the_event_a_display_failed_on_is_shown_as_text(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = FakeSource(tmp_path)
    run = Run(job, Guarded(Broken("output", OverflowError("too big")), None), CONFIG)
    finish(run, job)
    run.wait()
    out, err = capsys.readouterr()
    assert out.splitlines()[:2] == ["[rank 0] line 0", "[rank 1] line 1"]
    assert "(OverflowError: too big)" in err


def test_when_the_text_display_fails_too_the_run_goes_on_without_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken_write(self: object, stream: str, text: str) -> None:
        raise ValueError("closed file")

    monkeypatch.setattr("nbddp.display.text.TextDisplay._write", broken_write)
    job = FakeSource(tmp_path)
    guard = Guarded(Broken("output", RuntimeError("bad")), None)
    run = Run(job, guard, CONFIG)
    finish(run, job)
    result = run.wait()
    assert result.failure is None
    assert guard.inner is None
    _out, err = capsys.readouterr()
    assert "and so did the text display (ValueError: closed file)" in err


def test_an_error_whose_message_cannot_be_made_is_still_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    class Unsayable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no message")

    job = FakeSource(tmp_path)
    run = Run(job, Guarded(Broken("output", Unsayable()), None), CONFIG)
    finish(run, job)
    run.wait()
    assert "nbddp: the display failed (Unsayable)" in capsys.readouterr().err


def test_a_notice_too_long_for_one_line_is_cut(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = FakeSource(tmp_path)
    run = Run(job, Guarded(Broken("output", ValueError("v" * 100_000)), None), CONFIG)
    job.events.put(Notice("hello"))
    finish(run, job)
    run.wait()
    err = capsys.readouterr().err
    (line,) = [line for line in err.splitlines() if "display failed" in line]
    assert len(line) < 600


def test_keyboard_interrupt_from_a_display_still_stops_the_ranks(tmp_path: Path) -> None:
    job = StoppableSource(tmp_path)
    job.status = RunStatus.INTERRUPTED
    run = Run(job, Guarded(Broken("output", KeyboardInterrupt()), None), CONFIG)
    job.events.put(Text(0, "stdout", "x\n"))
    with pytest.raises(KeyboardInterrupt):
        run.wait()
    assert job.stopped == [RunStatus.INTERRUPTED]


def test_anything_else_escaping_the_pump_stops_the_ranks_before_it_is_raised(
    tmp_path: Path,
) -> None:
    job = StoppableSource(tmp_path)
    calls = 0

    def failing_wait(timeout: float | None = None) -> bool:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("the pump broke")
        return job.ended.wait(timeout)

    job.wait = failing_wait  # type: ignore[method-assign]
    run = Run(job, RecordingDisplay(), CONFIG)
    job.events.put(Text(0, "stdout", "x\n"))
    with pytest.raises(RuntimeError, match="the pump broke"):
        run.wait()
    assert job.stopped == [RunStatus.STOPPED]
    assert job.ended.is_set()
    # The end was taken from the queue while stopping: a second wait returns at once.
    assert run.wait(timeout=5).exit_codes == {0: 0, 1: 0}
