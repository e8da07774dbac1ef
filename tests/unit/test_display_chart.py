"""The metrics chart: bounded history, well-formed SVG for any number of points."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET

from nbddp.display.chart import MetricHistory, chart_html, chart_text, metric_summary, metric_svg

SVG = "{http://www.w3.org/2000/svg}"


def row(rank: int, step: int | None, **values: float) -> dict[str, object]:
    return {"rank": rank, "step": step, "time": 0.0, **values}


def test_svg_for_one_point_is_a_dot() -> None:
    root = ET.fromstring(metric_svg("loss", {0: [(0.0, 1.0)]}))
    assert root.tag == f"{SVG}svg"
    assert root.findall(f"{SVG}circle")
    assert not root.findall(f"{SVG}polyline")


def test_svg_for_many_points_and_ranks_has_a_line_per_rank() -> None:
    series = {r: [(float(i), math.sin(i / 10) + r) for i in range(1000)] for r in range(3)}
    root = ET.fromstring(metric_svg("loss<&>", series))
    lines = root.findall(f"{SVG}polyline")
    assert len(lines) == 3
    assert len(lines[0].attrib["points"].split()) == 1000
    assert "loss<&>" in "".join(root.itertext())  # escaped in the markup, intact when parsed


def test_svg_without_points_and_with_a_flat_series() -> None:
    ET.fromstring(metric_svg("empty", {}))
    root = ET.fromstring(metric_svg("flat", {0: [(0.0, 2.0), (1.0, 2.0)]}))
    assert root.findall(f"{SVG}polyline")


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
