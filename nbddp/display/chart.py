"""Live charts of ``nbddp.log`` metrics, as HTML with inline SVG: one panel per metric.

``MetricHistory.add(row)`` keeps per metric and rank a series of (step or row count, value),
thinned by half past ``max_points`` (the latest point always kept): memory stays constant.
``chart_html(history)`` draws a panel per metric (the first ``MAX_CHARTED``) and a legend, as
lines or, past ``MAX_LINES`` ranks, a mean over a min-max band. Plain HTML/SVG/CSS, no frontend
extension. Rows come from another process: nothing in them raises; non-finite values are left
out of the chart (``metric_summary`` shows them).
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from nbddp.display.plot import (
    MAX_RANK_LINES,
    PX_PER_POINT,
    WIDTH,
    Mode,
    Point,
    color,
    fmt,
    metric_svg,
    short,
)
from nbddp.wire.protocol import MetricRow

RESERVED = frozenset(("rank", "step", "time"))
MAX_CHARTED = 16
"""Metrics that get a chart panel (the first seen); the rest are only in ``Run.metrics``."""
MAX_SUMMARY = 300
"""Longest one-line summary of a row (a rank's header, the legend, the text display)."""
MAX_LEGEND_RANKS = 16
"""Ranks listed in the chart's legend; the others' latest values are in their own blocks."""
SHOWN_POINTS = 8000
"""Points of the visible lines of a whole chart, past which they are drawn coarser."""
HIDDEN_POINTS = 4000
"""The same for the per-rank lines a band hides until asked for."""
MAX_LINES = 4
"""The most ranks drawn as a line each; more are drawn as a band."""


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
    """Bounded per-metric, per-rank series for charts."""

    def __init__(self, max_points: int = 300) -> None:
        self.max_points = max_points
        self._series: dict[str, dict[int, _Series]] = {}
        self._rows: dict[int, int] = {}
        self.last: dict[int, MetricRow] = {}
        """Each rank's latest row."""
        self.stepped = False
        """Some row gave its step (else x is each rank's row count)."""

    def add(self, row: MetricRow) -> None:
        """Record one metric row."""
        self.add_many((row,))

    def add_many(self, rows: Iterable[MetricRow]) -> None:
        """Record metric rows, in order (as ``add`` of each; ranks log a row per step,
        so this loop is kept free of calls per value)."""
        series, counts, last, max_points = self._series, self._rows, self.last, self.max_points
        stepped = self.stepped
        for row in rows:
            rank = int(row.get("rank") or 0)
            last[rank] = row
            count = counts.get(rank, 0)
            counts[rank] = count + 1
            step = row.get("step")
            stepped = stepped or step is not None
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
        self.stepped = stepped

    def names(self) -> list[str]:
        """Metric names, in first-seen order."""
        return list(self._series)

    def series(self, name: str) -> dict[int, list[Point]]:
        """Rank -> points of ``name`` to draw."""
        return {r: s.drawn() for r, s in sorted(self._series.get(name, {}).items())}

    def ranks(self) -> list[int]:
        """The ranks with a point in some series."""
        return sorted({rank for per_rank in self._series.values() for rank in per_rank})

    def __bool__(self) -> bool:
        return bool(self._series)


def chart_html(history: MetricHistory) -> str:
    """Every metric's panel in a grid, then the legend."""
    mode: Mode = "lines" if len(history.ranks()) <= MAX_LINES else "band"
    x_label = "step" if history.stepped else "row"
    charted = {name: history.series(name) for name in history.names()}
    # Lines drawn in all panels: a line per rank, or a band's three (edges and mean)
    # plus its hidden per-rank lines. Past the budgets, lines get coarser.
    if mode == "band":
        shown = 3 * len(charted)
        hidden = sum(min(len(s), MAX_RANK_LINES) for s in charted.values())
    else:
        shown, hidden = sum(map(len, charted.values())), 0
    px, hidden_px = _px_per_point(shown, SHOWN_POINTS), _px_per_point(hidden, HIDDEN_POINTS)
    panels = "".join(
        f"<div>{metric_svg(name, series, mode, x_label, px, hidden_px)}</div>"
        for name, series in charted.items()
    )
    return (
        '<div class="nbddp-metrics" style="font-family:var(--jp-ui-font-family,sans-serif);'
        f'font-size:12px">{_style(history)}'
        f'<div style="display:flex;flex-wrap:wrap;gap:6px 14px">{panels}</div>'
        f"{_legend(history, mode)}</div>"
    )


def _px_per_point(lines: int, budget: int) -> int:
    """Pixels per drawn point so that ``lines`` lines across a panel stay within
    ``budget`` points (a multiple of ``PX_PER_POINT``, at least it)."""
    columns = lines * (WIDTH // PX_PER_POINT)
    return PX_PER_POINT * max(1, math.ceil(columns / budget))


def _legend(history: MetricHistory, mode: Mode) -> str:
    """Each rank's latest values (the first ``MAX_LEGEND_RANKS`` ranks), in its colour."""
    ranks = sorted(history.last)
    keys = "".join(
        f'<div class="nbddp-key" data-rank="{rank}"><span style="color:{color(rank)}">'
        f"&#9632;</span> rank {rank}: {html.escape(metric_summary(history.last[rank]))}</div>"
        for rank in ranks[:MAX_LEGEND_RANKS]
    )
    more = len(ranks) - MAX_LEGEND_RANKS
    if more > 0:
        keys += f"<div>… and {more} more ranks (each rank's block shows its latest values)</div>"
    hint = "point at a rank to pick out its line"
    if mode == "band" and history:
        hint = (
            "━ mean of the ranks, "
            '<span style="opacity:0.3">&#9608;</span> from their minimum to their maximum; '
            "point at a rank to draw its own line"
        )
    return (
        '<div class="nbddp-legend" style="margin-top:2px">'
        f'<div style="opacity:0.7">{hint if history else ""}</div>'
        '<div style="display:grid;grid-template-columns:repeat(auto-fill,minmax(28em,1fr));'
        f'font-family:var(--jp-code-font-family,monospace)">{keys}</div></div>'
    )


def _style(history: MetricHistory) -> str:
    """CSS for picking a rank out: its legend row under the pointer shows its line in
    every panel (band mode's are hidden until then) and fades the others."""
    rules = [
        ".nbddp-key{padding:0 4px;border-radius:3px}",
        ".nbddp-key:hover{background:rgba(127,127,127,0.2)}",
        ".nbddp-metrics:has(.nbddp-key:hover) .nbddp-rank-line,"
        ".nbddp-metrics:has(.nbddp-key:hover) .nbddp-mean-line{opacity:0.25}",
    ]
    for rank in sorted(history.last)[:MAX_LEGEND_RANKS]:
        rules.append(
            f'.nbddp-metrics:has(.nbddp-key[data-rank="{rank}"]:hover) '
            f'.nbddp-rank-line[data-ranks~="{rank}"]{{display:inline;opacity:1}}'
        )
    return f"<style>{''.join(rules)}</style>"


def chart_text(history: MetricHistory) -> str:
    """The plain-text stand-in for the chart: each rank's latest row on one line."""
    return "\n".join(
        f"metrics rank {rank}: {metric_summary(row)}" for rank, row in sorted(history.last.items())
    )


def metric_summary(row: MetricRow) -> str:
    """``step 40 loss=0.1234 acc=0.91``: a row in at most ``MAX_SUMMARY`` characters."""
    parts = []
    size = 0
    step = row.get("step")
    if step is not None:
        parts.append(f"step {format_value(step)}")
    for name, value in row.items():
        if size > MAX_SUMMARY:
            break  # the line is cut below: the rest of a huge row need not be formatted
        if name not in RESERVED:
            parts.append(f"{short(str(name))}={format_value(value)}")
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
        return short(str(value))
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
