"""One metric's chart panel, as an SVG document: axes with labels, and the ranks' values.

``metric_svg(name, series, mode)`` draws rank -> (step, value) points in a ``WIDTH`` x ``HEIGHT``
panel. ``"lines"``: a line per rank (equal ranks share one); ``"band"``: the mean over a min-max
band, the first ``MAX_RANK_LINES`` ranks' lines hidden for CSS to show. Lines are averaged per
``px_per_point`` pixels, so size never grows with steps. ``nbddp-*`` classes and ``data-*``
attributes are for the page's CSS and for tests; text takes ``currentColor``.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import Literal

from nbddp.display.axes import Axis, choose_scale, tick_labels

Point = tuple[float, float]
Mode = Literal["lines", "band"]


def fmt(value: float) -> str:
    """A metric value in at most four significant digits."""
    return f"{value:.4g}"


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
WIDTH, HEIGHT = 260, 176
"""A panel's size in pixels: three side by side fit a notebook's output area (about 830
pixels in JupyterLab on a 1280 pixel wide screen with its file browser open)."""
PX_PER_POINT = 2
"""Horizontal pixels per drawn point of a line."""
MAX_RANK_LINES = 16
"""In band mode, the ranks whose own (hidden) line is in the SVG, to show on demand."""
MAX_NAME = 40
"""Characters of a metric's name kept in a panel (the rest is cut with …)."""

_TOP, _BOTTOM, _RIGHT = 36, 24, 10  # the plot area's margins, in pixels
_CHAR = 7.0  # pixels per character of an 11px label, at most (DejaVu Sans digits: 7)
_MUTED = 'fill="currentColor" fill-opacity="0.7"'


def color(rank: int) -> str:
    """The line colour of ``rank``."""
    return PALETTE[rank % len(PALETTE)]


def short(text: str, limit: int = MAX_NAME) -> str:
    """``text`` cut to ``limit`` characters, the cut marked with …."""
    return text if len(text) <= limit else text[: max(limit - 1, 1)] + "…"


def metric_svg(
    name: str,
    series: dict[int, list[Point]],
    mode: Mode = "lines",
    x_label: str = "step",
    px_per_point: int = PX_PER_POINT,
    hidden_px_per_point: int = PX_PER_POINT,
) -> str:
    """One panel for ``name``. ``px_per_point``: horizontal pixels
    per drawn point of the visible lines and band, ``hidden_px_per_point`` of the hidden
    per-rank lines (a multiple of ``PX_PER_POINT``; more: fewer bytes, coarser lines)."""
    series = {rank: pts for rank, pts in series.items() if pts}
    points = [p for pts in series.values() for p in pts]
    scale = choose_scale([y for _, y in points])
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="nbddp-panel-svg" width="{WIDTH}" '
        f'height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-size="11" '
        f'data-metric="{html.escape(short(name))}" data-scale="{scale}">'
    )
    if not points:
        return head + _title(name, "", "no values yet") + "</svg>"

    plot_h = HEIGHT - _TOP - _BOTTOM
    y_count = max(2, plot_h // 28)  # labels 11 pixels high, 28 or more apart
    y_axis = Axis.fit([y for _, y in points], scale, count=y_count, exact=False)
    y_ticks, y_step = y_axis.ticks(y_count)
    y_labels = tick_labels(y_ticks, y_step)
    # Room for the value labels, and under them for the step axis' name.
    left = round(max(8 + _CHAR * max(map(len, y_labels)), 12 + _CHAR * len(x_label)))
    plot_w = WIDTH - left - _RIGHT
    x_axis = Axis.fit([x for x, _ in points], "linear", count=_x_count(plot_w), exact=True)
    frame = _Frame(left, plot_w, plot_h, x_axis, y_axis)

    groups = _equal_groups(series)
    band = mode == "band" and len(groups) > 1
    parts = [head, _title(name, _latest(series, band), _note(scale, groups, band))]
    parts += _axes(frame, y_ticks, y_labels, x_label)
    drawn = list(series) if band else [group[0] for group in groups]
    columns = {rank: frame.columns(series[rank]) for rank in drawn}
    if band:
        parts += _band(frame, series, columns, px_per_point // PX_PER_POINT)
        for rank in list(series)[:MAX_RANK_LINES]:
            line = frame.line(series[rank], columns[rank], hidden_px_per_point // PX_PER_POINT)
            parts.append(_polyline(line, [rank], hidden=True))
    else:
        for group in groups:
            first = group[0]
            line = frame.line(series[first], columns[first], px_per_point // PX_PER_POINT)
            parts.append(_polyline(line, group))
    parts.append("</svg>")
    return "".join(parts)


def _note(scale: str, groups: list[list[int]], band: bool) -> str:
    """What the panel shows, under its name: the scale, and how the ranks are drawn."""
    ranks = sum(map(len, groups))
    notes = ["log scale"] if scale == "log" else []
    if len(groups) == 1 and ranks > 1:
        notes.append("both ranks equal" if ranks == 2 else f"all {ranks} ranks equal")
    elif band:
        notes.append(f"mean and range of {ranks} ranks")
    else:
        notes += [f"ranks {', '.join(map(str, g))} equal" for g in groups if len(g) > 1]
    return "; ".join(notes)


def _latest(series: dict[int, list[Point]], band: bool) -> str:
    """The latest value, or the ranks' range of them (their mean, when drawn as a band)."""
    latest = [pts[-1][1] for pts in series.values()]
    if len(set(latest)) == 1:
        return fmt(latest[0])
    if band:
        return f"mean {fmt(sum(latest) / len(latest))}"
    return f"{fmt(min(latest))} … {fmt(max(latest))}"


Column = tuple[int, float, float, int]
"""A column of the plot with the points in it: (index, sum of x pixels, of y pixels, count)."""


class _Frame:
    """The plot area: data to pixels, and points gathered per column of pixels."""

    def __init__(self, left: int, plot_w: int, plot_h: int, x_axis: Axis, y_axis: Axis) -> None:
        self.left, self.plot_w, self.plot_h = left, plot_w, plot_h
        self.x_axis = x_axis
        self.x_map = x_axis.pixels(left, plot_w)
        self.y_map = y_axis.pixels(_TOP + plot_h, -plot_h)

    def x(self, value: float) -> float:
        """The pixel column of a step."""
        log, origin, k = self.x_map
        return self.left + ((math.log10(value) if log else value * 0.5) - origin) * k

    def y(self, value: float) -> float:
        """The pixel row of a value."""
        log, origin, k = self.y_map
        return _TOP + self.plot_h + ((math.log10(value) if log else value * 0.5) - origin) * k

    def pixel(self, point: Point) -> Point:
        return self.x(point[0]), self.y(point[1])

    def columns(self, points: Sequence[Point]) -> list[Column]:
        """``points`` gathered per column of ``PX_PER_POINT`` pixels, in drawing order
        (consecutive points in one column are one entry)."""
        # The hot loop of a chart (every stored point, every draw): arithmetic inline.
        _, x0, xk = self.x_map
        y_log, y0, yk = self.y_map
        left, bottom, log10 = self.left, _TOP + self.plot_h, math.log10
        out: list[Column] = []
        column, sx, sy, n = -1, 0.0, 0.0, 0
        for x, y in points:
            px = left + (x * 0.5 - x0) * xk
            py = bottom + ((log10(y) if y_log else y * 0.5) - y0) * yk
            here = int((px - left) // PX_PER_POINT)
            if here != column and n:
                out.append((column, sx, sy, n))
                sx, sy, n = 0.0, 0.0, 0
            column, sx, sy, n = here, sx + px, sy + py, n + 1
        if n:
            out.append((column, sx, sy, n))
        return out

    def line(self, points: Sequence[Point], columns: list[Column], merge: int) -> list[Point]:
        """A line through the mean of each ``merge`` columns, ending at the latest point."""
        drawn = [(sx / n, sy / n) for _, sx, sy, n in _merged(columns, merge)]
        last = self.pixel(points[-1])
        if drawn[-1] != last:
            drawn.append(last)
        return drawn


def _merged(columns: list[Column], merge: int) -> list[Column]:
    """Consecutive columns gathered ``merge`` at a time (1: as they are)."""
    if merge <= 1:
        return columns
    out: list[Column] = []
    for index, sx, sy, n in columns:
        index //= merge
        if out and out[-1][0] == index:
            _, px, py, pn = out[-1]
            out[-1] = (index, px + sx, py + sy, pn + n)
        else:
            out.append((index, sx, sy, n))
    return out


def _x_count(plot_w: int) -> int:
    """Step ticks wanted: one per 50 pixels keeps labels of up to 6 characters apart."""
    return max(2, plot_w // 50)


def _title(name: str, value: str, note: str) -> str:
    # The name gets what the latest value leaves of the top line.
    room = int((WIDTH - 12 - _CHAR * len(value)) / 7.4)
    return (
        f'<text x="2" y="13" font-size="12" font-weight="600" fill="currentColor">'
        f"{html.escape(short(name, max(room, 6)))}</text>"
        f'<text x="{WIDTH - 2}" y="13" text-anchor="end" {_MUTED}>{html.escape(value)}</text>'
        f'<text class="nbddp-note" x="2" y="28" {_MUTED}>'
        f"{html.escape(short(note, int((WIDTH - 4) / _CHAR)))}</text>"
    )


def _axes(frame: _Frame, y_ticks: list[float], y_labels: list[str], x_label: str) -> list[str]:
    left, right = frame.left, frame.left + frame.plot_w
    bottom = _TOP + frame.plot_h
    parts = []
    grid = []
    for tick, label in zip(y_ticks, y_labels, strict=True):
        y = frame.y(tick)
        grid.append(f"M{left} {y:.1f}H{right}")
        parts.append(
            f'<text class="nbddp-tick" x="{left - 5}" y="{y + 4:.1f}" text-anchor="end" '
            f"{_MUTED}>{label}</text>"
        )
    x_ticks, x_step = frame.x_axis.ticks(_x_count(frame.plot_w))
    axis_name_end = 2 + _CHAR * len(x_label)
    for tick, label in zip(x_ticks, tick_labels(x_ticks, x_step), strict=True):
        x = frame.x(tick)
        if not left - 0.5 <= x <= right + 0.5:
            continue
        half = _CHAR * len(label) / 2
        # Labels at the ends of the axis stay inside the panel and off the axis' name.
        anchor = "middle"
        if x + half > WIDTH - 1:
            anchor = "end"
        elif x - half < axis_name_end + 4:
            anchor = "start"
        grid.append(f"M{x:.1f} {_TOP}V{bottom}")
        parts.append(
            f'<text class="nbddp-tick" x="{x:.1f}" y="{bottom + 17}" text-anchor="{anchor}" '
            f"{_MUTED}>{label}</text>"
        )
    parts.append(
        f'<text class="nbddp-axis-name" x="2" y="{bottom + 17}" {_MUTED}>'
        f"{html.escape(x_label)}</text>"
    )
    return [
        f'<path d="{"".join(grid)}" stroke="currentColor" stroke-opacity="0.12" fill="none"/>',
        f'<path d="M{left} {_TOP}V{bottom}H{right}" stroke="currentColor" stroke-opacity="0.45" '
        'fill="none"/>',
        *parts,
    ]


def _band(
    frame: _Frame, series: dict[int, list[Point]], columns: dict[int, list[Column]], merge: int
) -> list[str]:
    """The band from the lowest rank to the highest and the line of their mean, from each
    rank's mean per ``merge`` columns, both ending at the ranks' latest points."""
    per_rank: list[dict[int, Point]] = [
        {index: (sx / n, sy / n) for index, sx, sy, n in _merged(cols, merge)}
        for cols in columns.values()
    ]
    upper, lower, mean = [], [], []
    for index in sorted({i for cols in per_rank for i in cols}):
        here = [cols[index] for cols in per_rank if index in cols]
        x = sum(p[0] for p in here) / len(here)
        ys = [p[1] for p in here]
        upper.append((x, min(ys)))  # pixels grow downwards: the smallest y is the top
        lower.append((x, max(ys)))
        mean.append((x, sum(ys) / len(ys)))
    ends = [frame.pixel(pts[-1]) for pts in series.values()]
    x = max(p[0] for p in ends)
    ys = [p[1] for p in ends]
    for line, y in ((upper, min(ys)), (lower, max(ys)), (mean, sum(ys) / len(ys))):
        if line[-1][0] < x:
            line.append((x, y))
        else:
            line[-1] = (x, y)
    return [
        f'<polygon class="nbddp-band" points="{_coords([*upper, *reversed(lower)])}" '
        'fill="currentColor" fill-opacity="0.16" stroke="none"/>',
        _polyline(mean, None),
    ]


def _polyline(points: list[Point], ranks: list[int] | None, hidden: bool = False) -> str:
    """The line of ``ranks`` (equal ones share it, in the first's colour), or of the mean
    (``ranks`` None), with a dot on its latest point."""
    rank = None if ranks is None else ranks[0]
    stroke = "currentColor" if rank is None else color(rank)
    kind = "nbddp-mean-line" if rank is None else "nbddp-rank-line"
    data = "" if ranks is None else f' data-rank="{rank}" data-ranks="{" ".join(map(str, ranks))}"'
    shown = ' display="none"' if hidden else ""
    x, y = points[-1]
    dot = f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{stroke}"/>'
    if len(points) == 1:
        return f'<g class="{kind}"{data}{shown}>{dot}</g>'
    width = 2 if rank is None else 1.75
    return (
        f'<g class="{kind}"{data}{shown}><polyline points="{_coords(points)}" fill="none" '
        f'stroke="{stroke}" stroke-width="{width}" stroke-linejoin="round"/>{dot}</g>'
    )


def _coords(points: list[Point]) -> str:
    return " ".join(f"{x:.1f},{y:.1f}" for x, y in points)


def _equal_groups(series: dict[int, list[Point]]) -> list[list[int]]:
    """Ranks grouped by equal points (a learning rate is the same on every rank)."""
    groups: dict[tuple[Point, ...], list[int]] = {}
    for rank, pts in series.items():
        groups.setdefault(tuple(pts), []).append(rank)
    return list(groups.values())
