"""Metric values no float can hold, and rows no chart could fit, never break a display.

``nbddp.log`` keeps what a rank logs as it is (``Run.metrics`` has the exact
value): NaN and infinity say a loss diverged, a huge int is still a number.
The notebook side shows each as well as it can (``nan``, ``inf``, ``~1e+400``),
leaves what it cannot place out of the chart, and bounds what it draws.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Any

from nbddp.display import chart
from nbddp.display.chart import MetricHistory, chart_html, metric_summary
from nbddp.display.kernel import KernelDisplay
from nbddp.notebook.panel.feed import PanelFeed, RankView


def row(step: Any = 1, **values: Any) -> dict[str, Any]:
    return {"rank": 0, "step": step, "time": 0.0, **values}


class Unprintable:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")

    __str__ = __repr__


HOSTILE = [
    row(big=10**400),  # OverflowError: int too large to convert to float
    row(step=10**5000, huge=10**5000),  # ValueError: Exceeds the limit (4300 digits)
    row(step=10**400, x=1.0),
    row(nan=float("nan"), inf=float("inf"), ninf=-float("inf")),
    row(big=1e308, small=-1e308),
    row(odd=Unprintable(), text="t" * 100_000),
]


def test_summaries_of_values_no_float_can_hold() -> None:
    assert metric_summary(row(big=10**400)) == "step 1 big=~1e+400"
    assert metric_summary(row(step=10**5000, huge=-(10**5000))) == "step ~1e+5000 huge=~-1e+5000"
    assert metric_summary(row(n=10**20)) == "step 1 n=1e+20"
    assert metric_summary(row(nan=float("nan"), inf=float("inf"))) == "step 1 nan=nan inf=inf"
    assert metric_summary(row(odd=Unprintable())) == "step 1 odd=<Unprintable>"


def test_a_summary_is_bounded() -> None:
    long = metric_summary(row(text="t" * 100_000, **{f"m{i}": i for i in range(10_000)}))
    assert len(long) <= chart.MAX_SUMMARY
    assert long.endswith("…")


def test_the_chart_leaves_out_what_it_cannot_place() -> None:
    history = MetricHistory()
    history.add_many(HOSTILE)
    history.add(row(step=2, big=3.0))
    assert history.series("big") == {0: [(1.0, 1e308), (2.0, 3.0)]}
    assert history.series("huge") == {}
    assert history.series("x") == {}
    assert history.series("nan") == {}
    page = chart_html(history)
    assert len(page) < 20_000
    # Every panel is well-formed and places every point: no NaN or infinite coordinate.
    for svg in re.findall(r"<svg.*?</svg>", page, re.DOTALL):
        root = ET.fromstring(svg)
        for element in root.iter():
            for name in ("x", "y", "cx", "cy", "points", "d"):
                value = element.attrib.get(name, "")
                assert not re.search(r"nan|inf", value, re.IGNORECASE), (name, value)


def test_the_chart_draws_a_bounded_number_of_metrics() -> None:
    history = MetricHistory()
    history.add(row(**{f"m{i}": float(i) for i in range(1000)}))
    page = chart_html(history)
    assert page.count("<svg") == chart.MAX_CHARTED
    assert len(page) < 100_000


class Publisher:
    def __init__(self) -> None:
        self.bundles: list[dict[str, str]] = []

    def show(self, bundle: dict[str, str]) -> int:
        self.bundles.append(bundle)
        return len(self.bundles) - 1

    def update(self, handle: int, bundle: dict[str, str]) -> None:
        self.bundles.append(bundle)

    def cell(self) -> object:
        return 1


def test_the_kernel_display_draws_hostile_rows() -> None:
    publisher = Publisher()
    display = KernelDisplay(publisher=publisher, chart_interval=0.0)
    for hostile in HOSTILE:
        display.metric(0, hostile)
        display.refresh()
    display.close()
    assert any("big=" in b["text/plain"] for b in publisher.bundles)


class Sink:
    def __init__(self) -> None:
        self.views: list[list[RankView]] = []

    def show_ranks(self, ranks: list[RankView]) -> None:
        self.views.append(ranks)

    def show_chart(self, html: str) -> None: ...
    def show_notice(self, text: str) -> None: ...


def test_the_panel_feed_draws_hostile_rows() -> None:
    sink = Sink()
    feed = PanelFeed(sink)
    for hostile in HOSTILE:
        feed.metric(0, hostile)
    feed.close()
    assert sink.views[-1][0].metric.startswith("step 1 odd=<Unprintable>")
