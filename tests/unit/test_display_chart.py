"""The metrics chart: bounded history, axes a person can read, the scale each metric gets,
how ranks are drawn, and a size per update that does not grow with the run."""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator

import pytest

from nbddp.display import plot
from nbddp.display.axes import Axis, choose_scale, tick_labels
from nbddp.display.chart import (
    MetricHistory,
    chart_html,
    chart_text,
    metric_summary,
    metric_svg,
)
from nbddp.wire.protocol import MetricRow

SVG = "{http://www.w3.org/2000/svg}"
STEPS_BOUND = 32_000
"""Bytes of a chart of 4 ranks x 3 metrics, at any number of steps."""
ANY_BOUND = 256_000
"""Bytes of any chart: 16 metrics at most, lines coarser past the chart's point budgets."""


def row(rank: int, step: int | None, **values: float) -> MetricRow:
    return {"rank": rank, "step": step, "time": 0.0, **values}


def run_rows(steps: int, ranks: int) -> Iterator[MetricRow]:
    """A run's rows: a loss falling fast then slowly (different per rank), a warm-up and
    cosine learning rate (the same on every rank), an accuracy rising to 0.95."""
    for step in range(steps):
        lr = 1e-3 * min(1.0, (step + 1) / 200) * 0.5 * (1 + math.cos(math.pi * step / steps))
        for rank in range(ranks):
            wobble = math.sin(step * 0.7 + rank)
            loss = 2.3 * math.exp(-step / (steps / 10)) * (1 + 0.05 * rank) + 0.08
            acc = 0.95 - 0.85 * math.exp(-step / (steps / 6)) + 0.01 * wobble
            yield row(rank, step, loss=loss + 0.01 * wobble, lr=lr, acc=acc)


def history_of(steps: int, ranks: int) -> MetricHistory:
    history = MetricHistory()
    history.add_many(run_rows(steps, ranks))
    return history


def panels(page: str) -> dict[str, ET.Element]:
    """Each metric's panel of a chart, parsed, by metric name."""
    found = [ET.fromstring(svg) for svg in re.findall(r"<svg.*?</svg>", page, re.DOTALL)]
    return {svg.attrib["data-metric"]: svg for svg in found}


def texts(svg: ET.Element, cls: str | None = None) -> list[str]:
    return [
        "".join(t.itertext())
        for t in svg.iter(f"{SVG}text")
        if cls is None or t.attrib.get("class") == cls
    ]


def lines(svg: ET.Element, cls: str = "nbddp-rank-line") -> list[ET.Element]:
    return [g for g in svg.iter(f"{SVG}g") if g.attrib.get("class") == cls]


def coords(group: ET.Element) -> list[tuple[float, float]]:
    line = group.find(f"{SVG}polyline")
    assert line is not None
    return [(float(x), float(y)) for x, y in (p.split(",") for p in line.attrib["points"].split())]


# -- the scale each metric gets --------------------------------------------------


def test_a_loss_falling_over_decades_gets_a_log_axis_that_says_so() -> None:
    loss = [2.3 * math.exp(-s / 400) + 0.08 for s in range(4000)]
    assert choose_scale(loss) == "log"
    svg = ET.fromstring(metric_svg("loss", {0: [(float(s), v) for s, v in enumerate(loss)]}))
    assert svg.attrib["data-scale"] == "log"
    assert "log scale" in texts(svg, "nbddp-note")[0]
    assert {"0.1", "0.2", "0.5", "1", "2"} <= set(texts(svg, "nbddp-tick"))


@pytest.mark.parametrize(
    ("values", "why"),
    [
        ([0.01 + 0.98 * s / 100 for s in range(100)], "accuracy: most values are high"),
        ([1.0 + 0.1 * math.sin(s) for s in range(100)], "less than a decade"),
        ([0.0, *(1 / (s + 1) for s in range(100))], "a zero has no logarithm"),
        ([-1.0, *(10.0**-s for s in range(10))], "a negative value has no logarithm"),
        ([1e-3 * 0.5 * (1 + math.cos(math.pi * s / 100)) for s in range(100)], "cosine lr"),
    ],
)
def test_a_linear_axis_where_a_log_one_would_not_help(values: list[float], why: str) -> None:
    assert choose_scale(values) == "linear", why


def test_a_step_decayed_learning_rate_gets_a_log_axis() -> None:
    assert choose_scale([0.1] * 30 + [0.01] * 30 + [0.001] * 40) == "log"


# -- axes and their labels -------------------------------------------------------


def test_a_4000_step_panel_labels_its_steps_and_values() -> None:
    history = history_of(4000, 1)
    found = panels(chart_html(history))
    assert list(found) == ["loss", "lr", "acc"]
    for svg in found.values():
        ticks = texts(svg, "nbddp-tick")
        assert {"0", "1k", "2k", "3k"} <= set(ticks), ticks
        assert texts(svg, "nbddp-axis-name") == ["step"]
    assert texts(found["acc"], "nbddp-tick")[:5] == ["0", "0.25", "0.50", "0.75", "1.00"]
    # One style per axis: not 0.001 beside 5e-4.
    assert texts(found["lr"], "nbddp-tick")[:5] == ["0", "2.5e-4", "5e-4", "7.5e-4", "1e-3"]
    assert found["acc"].attrib["data-scale"] == "linear"


def test_rows_without_a_step_are_placed_by_their_count() -> None:
    history = MetricHistory()
    for _ in range(50):
        history.add(row(0, None, loss=1.0))
    assert texts(panels(chart_html(history))["loss"], "nbddp-axis-name") == ["row"]


@pytest.mark.parametrize(
    ("ticks", "step", "labels"),
    [
        ([0.0, 0.25, 0.5], 0.25, ["0", "0.25", "0.50"]),
        ([0.0, 5e-4, 1e-3], 5e-4, ["0", "5e-4", "1e-3"]),
        ([500.0, 1000.0, 1500.0], 500.0, ["500", "1k", "1.5k"]),
        ([12.5, 12.75, 13.0], 0.25, ["12.50", "12.75", "13.00"]),
        ([0.1, 0.2, 0.5, 1.0, 2.0], None, ["0.1", "0.2", "0.5", "1", "2"]),
        ([1e-10, 1e-8, 1e-6], None, ["1e-10", "1e-8", "1e-6"]),
        ([0.0, 2e6, 4e6], 2e6, ["0", "2M", "4M"]),
        ([-1.0, 0.0, 1.0], 1.0, ["-1", "0", "1"]),
    ],
)
def test_tick_labels(ticks: list[float], step: float | None, labels: list[str]) -> None:
    assert tick_labels(ticks, step) == labels


def test_ticks_are_round_and_few() -> None:
    axis = Axis.fit([0.13, 0.96], "linear", count=4, exact=False)
    assert (axis.lo, axis.hi) == (0.0, 1.0)
    assert axis.ticks(4) == ([0.0, 0.25, 0.5, 0.75, 1.0], 0.25)
    steps = Axis.fit([0.0, 3999.0], "linear", count=5, exact=True)
    assert (steps.lo, steps.hi) == (0.0, 3999.0)  # the newest step is the right end
    assert steps.ticks(5)[0] == [0.0, 1000.0, 2000.0, 3000.0]
    decades = Axis.fit([1e-10, 1e-3], "log", count=3, exact=False)
    assert decades.ticks(3)[0] == [1e-9, 1e-6, 1e-3]


def test_values_no_span_fits_in_a_float_still_draw() -> None:
    svg = metric_svg("huge", {0: [(0.0, -1e308), (1.0, 1e308), (2.0, 5e-324)]})
    root = ET.fromstring(svg)
    assert "nan" not in svg and "inf" not in svg
    assert texts(root, "nbddp-tick")


# -- ranks: a line each, or a band ------------------------------------------------


def test_up_to_4_ranks_get_a_line_each_in_their_colour() -> None:
    loss = panels(chart_html(history_of(500, 4)))["loss"]
    drawn = lines(loss)
    assert [g.attrib["data-rank"] for g in drawn] == ["0", "1", "2", "3"]
    assert all("display" not in g.attrib for g in drawn)
    assert len({g.find(f"{SVG}polyline").attrib["stroke"] for g in drawn}) == 4  # type: ignore[union-attr]
    assert not lines(loss, "nbddp-mean-line")
    assert loss.find(f"{SVG}polygon") is None


def test_ranks_with_equal_values_share_one_line_and_the_panel_says_so() -> None:
    lr = panels(chart_html(history_of(500, 4)))["lr"]
    drawn = lines(lr)
    assert len(drawn) == 1
    assert drawn[0].attrib["data-ranks"] == "0 1 2 3"
    assert texts(lr, "nbddp-note") == ["all 4 ranks equal"]


def test_8_ranks_get_a_mean_line_over_a_band_and_hidden_rank_lines() -> None:
    page = chart_html(history_of(500, 8))
    loss = panels(page)["loss"]
    assert len(lines(loss, "nbddp-mean-line")) == 1
    band = [p for p in loss.iter(f"{SVG}polygon") if p.attrib["class"] == "nbddp-band"]
    assert len(band) == 1
    hidden = lines(loss)
    assert [g.attrib["data-rank"] for g in hidden] == [str(r) for r in range(8)]
    assert all(g.attrib["display"] == "none" for g in hidden)
    assert "mean and range of 8 ranks" in texts(loss, "nbddp-note")[0]
    # A legend row under the pointer shows that rank's line in every panel.
    for rank in range(8):
        assert (
            f'.nbddp-metrics:has(.nbddp-key[data-rank="{rank}"]:hover) '
            f'.nbddp-rank-line[data-ranks~="{rank}"]{{display:inline'
        ) in page
        assert f'<div class="nbddp-key" data-rank="{rank}">' in page


def test_up_to_four_ranks_are_lines_past_that_a_band() -> None:
    def drawn(ranks: int) -> tuple[int, int]:
        """Rank lines in the loss panel, and how many of them show."""
        drawn = lines(panels(chart_html(history_of(200, ranks)))["loss"])
        return len(drawn), sum("display" not in g.attrib for g in drawn)

    assert drawn(4) == (4, 4)  # a line each, all shown
    assert drawn(5)[1] < 5  # a band: the ranks' own lines hidden until asked for
    assert drawn(plot.MAX_RANK_LINES + 1) == (plot.MAX_RANK_LINES, 0)  # bounded, hidden


# -- bounded size, latest point kept -------------------------------------------------


@pytest.mark.parametrize("steps", [100, 4000, 100_000])
def test_the_chart_of_4_ranks_and_3_metrics_stays_under_a_fixed_size(steps: int) -> None:
    history = history_of(steps, 4)
    page = chart_html(history)
    print(f"{steps} steps x 4 ranks x 3 metrics: {len(page.encode()):,} bytes")
    assert len(page.encode()) < STEPS_BOUND
    right = plot.WIDTH - 10
    for name, svg in panels(page).items():
        for group in lines(svg):
            drawn = coords(group)
            # One point per PX_PER_POINT pixels at most, plus the latest point, drawn
            # exactly at the step axis' right end (the newest step).
            assert len(drawn) <= plot.WIDTH // plot.PX_PER_POINT + 1, name
            assert drawn[-1][0] == pytest.approx(right, abs=0.05), name
    assert f"step {steps - 1} " in chart_text(history)


def test_any_number_of_ranks_and_metrics_stays_under_a_fixed_size() -> None:
    history = MetricHistory()
    for step in range(300):
        for rank in range(64):
            values = {f"m{i}": math.sin(step / 10 + rank + i) + 2 for i in range(20)}
            history.add(row(rank, step, **values))
    page = chart_html(history)
    print(f"64 ranks x 16 charted metrics: {len(page.encode()):,} bytes")
    assert len(page.encode()) < ANY_BOUND
    assert page.count("<svg") == 16
    assert "… and 48 more ranks" in page


def test_history_is_bounded_and_keeps_the_latest_point() -> None:
    history = MetricHistory(max_points=100)
    for step in range(10_001):
        history.add(row(0, step, loss=1.0 / (step + 1)))
    points = history.series("loss")[0]
    assert len(points) <= 101
    assert points[0] == (0.0, 1.0)
    assert points[-1] == (10_000.0, 1.0 / 10_001)
    assert [p[0] for p in points] == sorted(p[0] for p in points)


def test_history_uses_row_count_without_step_and_skips_non_finite() -> None:
    history = MetricHistory()
    history.add(row(1, None, loss=3.0))
    history.add(row(1, None, loss=float("nan")))
    history.add(row(1, None, loss=1.0))
    assert history.series("loss") == {1: [(0.0, 3.0), (2.0, 1.0)]}
    assert history.ranks() == [1]
    assert not history.stepped


# -- single panels and the legend --------------------------------------------------


def test_svg_for_one_point_is_a_dot() -> None:
    root = ET.fromstring(metric_svg("loss", {0: [(0.0, 1.0)]}))
    assert root.tag == f"{SVG}svg"
    assert list(root.iter(f"{SVG}circle"))
    assert not list(root.iter(f"{SVG}polyline"))


def test_svg_without_points_and_with_a_flat_series() -> None:
    empty = ET.fromstring(metric_svg("empty", {}))
    assert "no values yet" in texts(empty)
    flat = ET.fromstring(metric_svg("flat", {0: [(0.0, 2.0), (1.0, 2.0)]}))
    assert list(flat.iter(f"{SVG}polyline"))
    assert "2" in " ".join(texts(flat, "nbddp-tick"))


def test_a_metric_name_is_escaped_and_cut_to_fit() -> None:
    root = ET.fromstring(metric_svg("loss<&>" + "x" * 100, {0: [(0.0, 1.0), (1.0, 2.0)]}))
    title = texts(root)[0]
    assert title.startswith("loss<&>x") and title.endswith("…")
    assert len(title) <= plot.MAX_NAME


def test_chart_html_has_a_panel_per_metric_and_a_legend() -> None:
    history = MetricHistory()
    for step in range(5):
        for rank in range(2):
            history.add(row(rank, step, loss=1.0 / (step + 1), acc=step / 5))
    page = chart_html(history)
    assert page.count("<svg") == 2
    assert "rank 1: step 4 loss=0.2 acc=0.8" in page
    assert chart_text(history).splitlines() == [
        "metrics rank 0: step 4 loss=0.2 acc=0.8",
        "metrics rank 1: step 4 loss=0.2 acc=0.8",
    ]


def test_metric_summary() -> None:
    assert metric_summary(row(0, 3, loss=0.123456, n=7)) == "step 3 loss=0.1235 n=7"
    assert metric_summary({"rank": 0, "step": None, "time": 1.0, "loss": 2.5}) == "loss=2.5"
