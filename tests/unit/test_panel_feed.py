"""``PanelFeed``: what a panel run draws, how often, and that the end is always drawn."""

from __future__ import annotations

from pathlib import Path

from nbddp.notebook.panel.feed import PanelFeed, RankView


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Sink:
    def __init__(self) -> None:
        self.ranks: list[list[RankView]] = []
        self.charts: list[str] = []
        self.notices: list[str] = []

    def show_ranks(self, ranks: list[RankView]) -> None:
        self.ranks.append(ranks)

    def show_chart(self, html: str) -> None:
        self.charts.append(html)

    def show_notice(self, text: str) -> None:
        self.notices.append(text)


def make(tail: int = 3) -> tuple[PanelFeed, Sink, Clock]:
    sink, clock = Sink(), Clock()
    feed = PanelFeed(sink, tail=tail, interval=0.25, clock=clock)
    feed.attach(Path("/logs"), 2)
    return feed, sink, clock


def test_progress_bars_redraw_in_place_and_only_the_tail_is_kept() -> None:
    feed, sink, _ = make(tail=3)
    feed.output(0, "stdout", "".join(f"\r{i}/100" for i in range(101)) + "\n")
    for i in range(5):
        feed.output(1, "stdout", f"line {i}\n")
    feed.close()
    zero, one = sink.ranks[-1]
    assert zero.lines == ("100/100",)
    assert one.lines == ("line 2", "line 3", "line 4") and one.hidden == 2
    assert one.log == Path("/logs/rank1.log")


def test_draws_at_most_once_per_interval_however_much_arrives() -> None:
    feed, sink, clock = make()
    for i in range(1000):
        feed.output(0, "stdout", f"{i}\n")
        feed.refresh()
        clock.now += 0.001  # 1000 lines in 1 s
    assert 3 <= len(sink.ranks) <= 5


def test_nothing_changed_means_no_draw_until_the_elapsed_time_ticks() -> None:
    feed, sink, clock = make()
    feed.state(0, "running")
    feed.state(1, "running")
    feed.refresh()
    drawn = len(sink.ranks)
    clock.now += 0.3
    feed.refresh()
    assert len(sink.ranks) == drawn
    delay = feed.refresh()
    assert delay is not None and 0 < delay <= 1.0
    clock.now += 1.0
    feed.refresh()
    assert len(sink.ranks) == drawn + 1 and sink.ranks[-1][0].elapsed == "1s"


def test_states_metrics_and_the_chart() -> None:
    feed, sink, clock = make()
    feed.state(0, "running")
    for step in range(3):
        feed.metric(0, {"rank": 0, "step": step, "time": 0.0, "loss": 1.0 / (step + 1)})
    clock.now += 2.5
    feed.state(0, "done")
    feed.state(1, "failed")
    feed.close()
    zero, one = sink.ranks[-1]
    assert (zero.state, zero.elapsed, zero.metric) == ("done", "2s", "step 2 loss=0.3333")
    assert one.state == "failed" and one.metric == ""
    assert len(sink.charts) == 1 and "<svg" in sink.charts[0] and "loss" in sink.charts[0]
    assert feed.refresh() is None  # every rank ended and everything is drawn


def test_output_after_the_last_refresh_is_drawn_by_close() -> None:
    feed, sink, _ = make()
    feed.output(0, "stdout", "a\n")
    feed.refresh()
    feed.output(0, "stderr", "last words\n")  # inside the rate limit: not drawn yet
    feed.refresh()
    assert sink.ranks[-1][0].lines == ("a",)
    feed.close()
    assert sink.ranks[-1][0].lines == ("a", "last words")


def test_notices_pass_straight_through() -> None:
    feed, sink, _ = make()
    feed.notice("2 CPU processes")
    assert sink.notices == ["2 CPU processes"]


def test_output_held_back_by_the_rate_limit_is_drawn_when_it_allows() -> None:
    # While ranks run, a refresh with nothing new waits for the elapsed seconds to
    # tick over; new output must not wait that long, only for the rate limit.
    feed, sink, clock = make()
    feed.state(0, "running")
    feed.refresh()  # draws
    clock.now += 0.05
    feed.output(0, "stdout", "late line\n")
    wait = feed.refresh()  # held back: drawn 0.05 s ago
    assert wait is not None and wait <= 0.25
    clock.now += wait
    feed.refresh()
    assert sink.ranks[-1][0].lines == ("late line",)
