"""``RunModel``: what the displays know of each rank, and what changed since the last draw."""

from __future__ import annotations

from pathlib import Path

import pytest

from nbddp.display.blocks import RUN_COLORS, STATE_COLORS
from nbddp.display.model import RankModel, RunModel, format_elapsed
from nbddp.launcher.events import RankState, RunStatus


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def make(**kwargs: object) -> tuple[RunModel, Clock]:
    clock = Clock()
    model = RunModel(clock=clock, **kwargs)  # type: ignore[arg-type]
    model.attach(Path("/runs/r"), 2)
    return model, clock


def test_attach_makes_every_rank_in_order_starting_and_dirty() -> None:
    model, _ = make()
    assert list(model.ranks) == [0, 1]
    zero = model.ranks[0]
    assert zero.state is RankState.STARTING and zero.dirty and zero.metric is None
    assert model.log(1) == Path("/runs/r/rank1.log")
    model.output(5, "stdout", "late\n")  # a rank beyond attach gets a model too
    assert list(model.ranks) == [0, 1, 5] and model.ranks[5].lines() == ["late"]


def test_states_are_rank_states_and_the_first_end_is_kept() -> None:
    model, clock = make()
    model.state(0, "running")
    assert model.ranks[0].state is RankState.RUNNING
    clock.now += 3.7
    model.state(0, RankState.FAILED)
    clock.now += 10
    model.state(0, "stopped")  # a later end does not move the end time
    zero = model.ranks[0]
    assert zero.state is RankState.STOPPED and zero.ended_at == pytest.approx(53.7)
    assert zero.elapsed_text(clock.now) == "3s"
    assert model.ranks[1].elapsed_text(clock.now) == "13s"  # still going
    with pytest.raises(KeyError):
        model.state(0, "sleeping")


def test_running_until_every_rank_has_ended() -> None:
    model, _ = make()
    assert model.running()
    model.state(0, "done")
    assert model.running()
    model.state(1, "failed")
    assert not model.running()


def test_output_goes_to_live_ranks_screens_only() -> None:
    model, _ = make(live={0}, tail=2)
    for rank in (0, 1):
        model.ranks[rank].dirty = False
    model.output(0, "stdout", "a\nb\nc\n")
    model.output(1, "stdout", "not shown\n")
    zero, one = model.ranks[0], model.ranks[1]
    assert zero.lines() == ["b", "c"] and zero.hidden == 1 and zero.dirty
    assert one.screen is None and one.lines() == [] and one.hidden == 0 and not one.dirty
    assert model.shows(0) and not model.shows(1)


def test_metrics_keep_the_latest_row_and_reach_the_history_when_read() -> None:
    model, _ = make()
    rows = [{"rank": 1, "step": s, "time": 0.0, "loss": 1.0 / (s + 1)} for s in range(3)]
    for row in rows:
        model.metric(1, row)
    one = model.ranks[1]
    assert one.metric is rows[-1] and one.summary() == "step 2 loss=0.3333"
    assert model.ranks[0].summary() == ""
    assert model.chart_dirty
    history = model.history
    assert history.names() == ["loss"] and len(history.series("loss")[1]) == 3
    assert model.history.series("loss") == history.series("loss")  # taken in once


def test_what_changed_since_the_last_draw() -> None:
    model, clock = make()
    assert model.changed() and model.stale(clock.now)
    for entry in model.ranks.values():
        entry.drawn(clock.now)
    assert not model.changed() and not model.stale(clock.now)
    clock.now += 0.5
    assert not model.stale(clock.now)  # the elapsed time still reads "0s"
    clock.now += 0.5
    assert model.stale(clock.now) and not model.changed()  # now "1s"
    for entry in model.ranks.values():
        entry.drawn(clock.now)
    model.state(1, "running")
    assert model.changed() and not model.ranks[0].stale(clock.now)
    model.mark_dirty()
    assert all(entry.dirty for entry in model.ranks.values())


def test_tick_delay_is_time_to_the_next_whole_second_of_the_run() -> None:
    model, clock = make()
    clock.now += 2.25
    assert model.tick_delay() == pytest.approx(0.75)


def test_limiters_pace_ranks_and_chart_separately() -> None:
    model, clock = make(interval=0.1, chart_interval=0.5)
    assert model.limiter.try_fire() and model.chart_limiter.try_fire()
    clock.now += 0.1
    assert model.limiter.ready() and model.chart_limiter.delay() == pytest.approx(0.4)


def test_rank_model_without_a_log_dir_or_screen() -> None:
    model = RunModel(clock=Clock())
    assert model.log(0) is None
    entry = RankModel(3, None, started_at=10.0)
    assert entry.elapsed(12.5) == 2.5 and entry.lines() == []


def test_format_elapsed() -> None:
    assert format_elapsed(7.9) == "7s"
    assert format_elapsed(185) == "3m05s"
    assert format_elapsed(3720) == "1h02m"


def test_state_colours_find_plain_names_too() -> None:
    assert STATE_COLORS[RankState.DONE] == STATE_COLORS["done"] == "#2ca02c"
    assert "running" not in STATE_COLORS and "starting" not in RUN_COLORS
    assert RUN_COLORS[RunStatus.TIMEOUT] == RUN_COLORS["timed out"]
    assert RUN_COLORS["failed"] == "#d62728"
    assert RUN_COLORS["interrupted"] == RUN_COLORS[RankState.STOPPED]
