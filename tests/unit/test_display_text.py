"""The text display: rank-prefixed lines, readable tqdm, compact metric lines."""

from __future__ import annotations

import io

from nbddp.display.text import LineAssembler, TextDisplay, apply_carriage_returns


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make(**kwargs: object) -> tuple[TextDisplay, io.StringIO, io.StringIO, Clock]:
    out, err, clock = io.StringIO(), io.StringIO(), Clock()
    return TextDisplay(out, err, clock=clock, **kwargs), out, err, clock  # type: ignore[arg-type]


def test_lines_are_prefixed_and_whole() -> None:
    display, out, _, _ = make()
    display.output(0, "stdout", "hel")
    display.output(1, "stdout", "x\n")
    display.output(0, "stdout", "lo\nwor")
    display.close()
    assert out.getvalue() == "[rank 1] x\n[rank 0] hello\n[rank 0] wor\n"


def test_nothing_dropped_under_a_flood() -> None:
    display, out, _, _ = make()
    for i in range(0, 100_000, 1000):
        display.output(0, "stdout", "".join(f"{j}\n" for j in range(i, i + 1000)))
    display.close()
    assert out.getvalue().count("\n") == 100_000


def test_tqdm_bar_is_one_line_with_its_final_state() -> None:
    display, _, err, _ = make()
    for i in range(101):
        display.output(0, "stderr", f"\r{i:3d}%|{'#' * (i // 10):<10}|\x1b[A")
    display.output(0, "stderr", "\n")
    assert err.getvalue() == "[rank 0] 100%|##########|\n"


def test_running_bar_is_shown_every_progress_interval() -> None:
    display, _, err, clock = make(progress_interval=10.0)
    display.output(0, "stderr", "\r 10%|#")
    assert display.refresh() == 10.0
    assert err.getvalue() == ""
    clock.now += 10
    display.refresh()
    display.refresh()
    assert err.getvalue() == "[rank 0]  10%|#\n"
    display.output(0, "stderr", "\r 20%|##")
    clock.now += 10
    display.refresh()
    assert err.getvalue().splitlines()[-1] == "[rank 0]  20%|##"


def test_metric_lines_are_compact_and_rate_limited() -> None:
    display, out, _, clock = make(metric_interval=1.0)
    for step in range(100):
        display.metric(0, {"rank": 0, "step": step, "time": 0.0, "loss": 1 / (step + 1)})
    assert out.getvalue() == "[rank 0] step 0 loss=1\n"
    assert display.refresh() == 1.0
    clock.now += 1.0
    display.refresh()
    assert out.getvalue().splitlines()[-1] == "[rank 0] step 99 loss=0.01"
    display.metric(0, {"rank": 0, "step": 100, "time": 0.0, "loss": 0.5})
    display.close()
    assert out.getvalue().splitlines()[-1] == "[rank 0] step 100 loss=0.5"


def test_rank_filter_applies_to_output_and_metrics() -> None:
    display, out, _, _ = make(ranks={0})
    display.output(1, "stdout", "one\n")
    display.metric(1, {"rank": 1, "step": 0, "time": 0.0, "loss": 1.0})
    display.output(0, "stdout", "zero\n")
    display.close()
    assert out.getvalue() == "[rank 0] zero\n"


def test_partial_bar_stays_small() -> None:
    lines = LineAssembler()
    for i in range(10_000):
        lines.feed(0, "stderr", f"\r{i:6d} it")
    assert len(lines._partial[(0, "stderr")]) < 40
    assert lines.drain() == [(0, "stderr", "  9999 it")]


def test_apply_carriage_returns() -> None:
    assert apply_carriage_returns("10%\r20%\r30%") == "30%"
    assert apply_carriage_returns("abcdef\rXY") == "XYcdef"
    assert apply_carriage_returns("plain") == "plain"
    assert apply_carriage_returns("done\r") == "done"
    assert apply_carriage_returns("abc\rX") == "Xbc"
    assert apply_carriage_returns("a\x1b[Ab") == "ab"


def test_lines_are_assembled_per_rank_and_stream() -> None:
    lines = LineAssembler()
    assert lines.feed(0, "stdout", "hel") == []
    assert lines.feed(1, "stdout", "other\n") == ["other"]
    assert lines.feed(0, "stdout", "lo\nwor") == ["hello"]
    assert lines.drain() == [(0, "stdout", "wor")]


def test_stderr_goes_to_stderr_and_a_redrawn_line_shows_its_last_state() -> None:
    display, out, err, _ = make()
    display.output(0, "stdout", "a\nb")
    display.output(1, "stderr", "warn\n")
    display.output(1, "stdout", " 50%\r100%\n")
    assert out.getvalue() == "[rank 0] a\n[rank 1] 100%\n"
    display.close()
    assert out.getvalue().endswith("[rank 0] b\n")
    assert err.getvalue() == "[rank 1] warn\n"
