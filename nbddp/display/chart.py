"""Compact live charts of ``nbddp.log`` metrics, as inline SVG inside HTML.

Contract: ``MetricHistory.add(row)`` takes the rows ``nbddp.log`` sends
(``rank``, ``step``, ``time`` and the values) and keeps, per metric and
rank, a series of (x, y) points: x is the step, or the rank's row count
when no step was given. Each series is bounded: past ``max_points`` it is
thinned by half (every other point, then every fourth new one, ...), and
the latest point is always kept, so memory and SVG size stay constant
however long training runs. (The full history is ``Run.metrics``.)

``chart_html(history)`` draws one small panel per metric (the first
``MAX_CHARTED`` metrics), one line per rank, and a legend with each rank's
latest value. It is plain HTML and
SVG: JupyterLab, classic Notebook and VS Code show it without a frontend
extension. ``metric_svg`` draws one panel and is a well-formed SVG document.

Rows are data from another process: any value in them is drawn or left out,
never raised on. A value or step no float can hold (``10**400``), NaN and
infinity are kept in ``Run.metrics`` as they are but left out of the chart;
``metric_summary`` shows them (``~1e+400``, ``nan``, ``inf``), shows what is
not a number by its type, and is at most ``MAX_SUMMARY`` characters.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from nbddp.wire.protocol import MetricRow

PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
RESERVED = frozenset(("rank", "step", "time"))
MAX_CHARTED = 16
"""Metrics that get a chart panel (the first seen); the rest are only in ``Run.metrics``."""
MAX_SUMMARY = 300
"""Longest one-line summary of a row (a rank's header, the legend, the text display)."""
_MAX_NAME = 40  # characters of a metric's name shown in a panel's title

Point = tuple[float, float]


def color(rank: int) -> str:
    """The line colour of ``rank``."""
    return PALETTE[rank % len(PALETTE)]


def fmt(value: float) -> str:
    """A metric value in at most four significant digits."""
    return f"{value:.4g}"


@dataclass
class _Series:
    points: list[Point] = field(default_factory=list)
    latest: Point | None = None
    stride: int = 1
    count: int = 0

    def add(self, point: Point, max_points: int) -> None:
        self.latest = point
        if self.count % self.stride == 0:
            self.points.append(point)
            if len(self.points) > max_points:
                # Why thin instead of a ring buffer: the chart should show the
                # whole run's shape, not only its recent past.
                self.points = self.points[::2]
                self.stride *= 2
        self.count += 1

    def drawn(self) -> list[Point]:
        if self.latest is not None and (not self.points or self.points[-1] != self.latest):
            return [*self.points, self.latest]
        return list(self.points)


class MetricHistory:
    """Bounded per-metric, per-rank series for charts (see module contract)."""

    def __init__(self, max_points: int = 300) -> None:
        self.max_points = max_points
        self._series: dict[str, dict[int, _Series]] = {}
        self._rows: dict[int, int] = {}
        self.last: dict[int, MetricRow] = {}
        """Each rank's latest row."""

    def add(self, row: MetricRow) -> None:
        """Record one metric row."""
        self.add_many((row,))

    def add_many(self, rows: Iterable[MetricRow]) -> None:
        """Record metric rows, in order (as ``add`` of each; ranks log a row per step,
        so this loop is kept free of calls per value)."""
        series, counts, last, max_points = self._series, self._rows, self.last, self.max_points
        for row in rows:
            rank = int(row.get("rank") or 0)
            last[rank] = row
            count = counts.get(rank, 0)
            counts[rank] = count + 1
            step = row.get("step")
            x = float(count) if step is None else _finite(step)
            if x is None:
                continue  # a step no chart can place: the row is only in Run.metrics
            for name, value in row.items():
                if name in RESERVED:
                    continue
                y = value if type(value) is float else _finite(value)
                if y is None or not math.isfinite(y):
                    continue  # a NaN loss is in Run.metrics; it cannot be drawn
                per_rank = series.get(name)
                if per_rank is None:
                    if len(series) >= MAX_CHARTED:
                        continue
                    per_rank = series[name] = {}
                line = per_rank.get(rank)
                if line is None:
                    line = per_rank[rank] = _Series()
                line.add((x, y), max_points)

    def names(self) -> list[str]:
        """Metric names, in first-seen order."""
        return list(self._series)

    def series(self, name: str) -> dict[int, list[Point]]:
        """Rank -> points of ``name`` to draw."""
        return {r: s.drawn() for r, s in sorted(self._series.get(name, {}).items())}

    def __bool__(self) -> bool:
        return bool(self._series)


def metric_svg(
    name: str, series: dict[int, list[Point]], width: int = 240, height: int = 72
) -> str:
    """One panel: ``name``'s lines per rank, with the y range labelled."""
    points = [p for pts in series.values() for p in pts]
    pad_l, pad_r, pad_t, pad_b = 4, 4, 14, 4
    plot_w, plot_h = width - pad_l - pad_r, height - pad_t - pad_b
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="monospace" font-size="10">',
        f'<rect x="{pad_l}" y="{pad_t}" width="{plot_w}" height="{plot_h}" '
        'fill="none" stroke="#888" stroke-opacity="0.5" stroke-width="1"/>',
        f'<text x="{pad_l}" y="10" fill="currentColor">{html.escape(_short(name))}</text>',
    ]
    if points:
        xs, ys = [p[0] for p in points], [p[1] for p in points]
        x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
        parts.append(
            f'<text x="{width - pad_r}" y="10" text-anchor="end" fill="#888">'
            f"{fmt(y0)} … {fmt(y1)}</text>"
        )

        # Halves first: the span of -1e308 .. 1e308 is no float, half of it is.
        def sx(x: float) -> float:
            span = x1 / 2 - x0 / 2
            return pad_l + (plot_w / 2 if span == 0 else (x / 2 - x0 / 2) / span * plot_w)

        def sy(y: float) -> float:
            span = y1 / 2 - y0 / 2
            return pad_t + (plot_h / 2 if span == 0 else (y1 / 2 - y / 2) / span * plot_h)

        for rank, pts in series.items():
            if len(pts) == 1:
                x, y = pts[0]
                parts.append(
                    f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2" fill="{color(rank)}"/>'
                )
            elif pts:
                coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
                parts.append(
                    f'<polyline points="{coords}" fill="none" stroke="{color(rank)}" '
                    'stroke-width="1.5"/>'
                )
    parts.append("</svg>")
    return "".join(parts)


def chart_html(history: MetricHistory) -> str:
    """Every metric's panel side by side, then a legend of the ranks' latest values."""
    panels = "".join(
        f'<div style="margin:0 8px 4px 0">{metric_svg(name, history.series(name))}</div>'
        for name in history.names()
    )
    legend = " ".join(
        f'<span style="color:{color(rank)}">&#9632; rank {rank}: '
        f"{html.escape(metric_summary(row))}</span>"
        for rank, row in sorted(history.last.items())
    )
    return (
        '<div class="nbddp-metrics" style="font-family:monospace;font-size:11px">'
        f'<div style="display:flex;flex-wrap:wrap">{panels}</div><div>{legend}</div></div>'
    )


def chart_text(history: MetricHistory) -> str:
    """The plain-text stand-in for the chart: each rank's latest row on one line."""
    return "\n".join(
        f"metrics rank {rank}: {metric_summary(row)}" for rank, row in sorted(history.last.items())
    )


def metric_summary(row: MetricRow) -> str:
    """``step 40 loss=0.1234 acc=0.91``: a row in one short line (see module contract)."""
    parts = []
    size = 0
    step = row.get("step")
    if step is not None:
        parts.append(f"step {format_value(step)}")
    for name, value in row.items():
        if size > MAX_SUMMARY:
            break  # the line is cut below: the rest of a huge row need not be formatted
        if name not in RESERVED:
            parts.append(f"{_short(str(name))}={format_value(value)}")
            size += len(parts[-1]) + 1
    line = " ".join(parts)
    return line if len(line) <= MAX_SUMMARY else line[: MAX_SUMMARY - 1] + "…"


def format_value(value: object) -> str:
    """A metric value as the summary shows it: floats in four digits, ints whole while
    they are short, ``~1e+400`` past what a float holds, anything else by its type."""
    if isinstance(value, float):
        return fmt(value)
    if isinstance(value, int):
        if -(10**15) < value < 10**15:
            return str(value)
        try:
            return fmt(float(value))
        except OverflowError:
            sign = "-" if value < 0 else ""
            return f"~{sign}1e+{int(math.log10(abs(value)))}"
    try:
        return _short(str(value))
    except Exception:  # a value from another process: its __str__ is not ours to trust
        return f"<{type(value).__name__}>"


def _finite(value: object) -> float | None:
    """``value`` as a finite float, or None where no float can hold it."""
    if not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _short(text: str) -> str:
    return text if len(text) <= _MAX_NAME else text[: _MAX_NAME - 1] + "…"
