"""One metric's chart panel, as an SVG document: axes with labels, and the ranks' values.

``metric_svg(name, series, mode)`` draws rank -> (step, value) points in a ``WIDTH`` x ``HEIGHT``
panel: name and latest value, what it shows, a value axis (log when ``choose_scale`` says),
a step axis. ``"lines"``: a line per rank (equal ranks share one); ``"band"``: the mean over a
min-max band, the first ``MAX_RANK_LINES`` ranks' lines hidden for CSS to show. Lines are averaged
per ``px_per_point`` pixels, so size never grows with steps. ``nbddp-*`` classes and ``data-*``
attributes are for the page's CSS and for tests; text takes ``currentColor``.

The axes: ``choose_scale(values)`` is ``"log"`` when all are positive, span at least
``LOG_MIN_RATIO`` and a linear axis would press most into its bottom quarter; else ``"linear"``.
``Axis.fit`` builds an axis (log: the exact range with a little room; linear: widened to round
ticks; ``exact``: the steps seen), ``Axis.pixels`` places values, ``Axis.ticks(count)`` lists about
``count`` round ticks, and ``tick_labels`` writes them in a few characters (``0.25``, ``1.5k``,
``5e-4``). Values are finite floats; a range no float can span ticks only its ends.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Point = tuple[float, float]
Mode = Literal["lines", "band"]

ScaleKind = Literal["linear", "log"]

LOG_MIN_RATIO = 10.0
"""A metric is drawn on a log axis only if its largest value is this many times its smallest."""
_LOG_PAD = 0.04  # of the log axis' span, above and below the values, so no line hugs a border
_SUFFIXES = ("", "k", "M", "G", "T", "P", "E")


def choose_scale(values: Sequence[float]) -> ScaleKind:
    """``"log"`` or ``"linear"`` for these values."""
    if not values:
        return "linear"
    ordered = sorted(values)
    lo, hi, median = ordered[0], ordered[-1], ordered[len(ordered) // 2]
    if lo <= 0 or hi / lo < LOG_MIN_RATIO:
        return "linear"
    # Halves: hi - lo of two huge floats is no float, half of it is.
    return "log" if median / 2 - lo / 2 < (hi / 2 - lo / 2) / 4 else "linear"


@dataclass(frozen=True)
class Axis:
    """A linear or log axis from ``lo`` to ``hi`` (data units; ``lo < hi``)."""

    lo: float
    hi: float
    log: bool = False
    step: float | None = None
    """The spacing of a linear axis' round ticks, when it was widened to them."""

    @classmethod
    def fit(cls, values: Sequence[float], scale: ScaleKind, count: int, exact: bool) -> Axis:
        """An axis over ``values``; ``count``: ticks wanted."""
        lo, hi = min(values), max(values)
        if scale == "log" and lo > 0:
            a, b = math.log10(lo), math.log10(hi)
            pad = max(b - a, 0.1) * _LOG_PAD
            return cls(10 ** (a - pad), 10 ** min(b + pad, 308.0), log=True)
        if lo == hi:
            # One value: a band around it, so it is drawn mid-height.
            pad = abs(lo) / 10 if lo else 1.0
            lo, hi = lo - pad, hi + pad
        step = None if exact else _round_step(hi - lo, count)
        if step is None:
            return cls(lo, hi)
        wide_lo, wide_hi = math.floor(lo / step) * step, math.ceil(hi / step) * step
        if not (math.isfinite(wide_lo) and math.isfinite(wide_hi)):
            return cls(lo, hi)
        return cls(wide_lo, wide_hi, step=step)

    def pixels(self, start: float, length: float) -> tuple[bool, float, float]:
        """``(log, origin, k)`` placing a value ``v`` at pixel
        ``start + (t - origin) * k``, where ``t`` is ``log10(v)`` on a log axis and
        ``v * 0.5`` on a linear one (halves: the span of -1e308 .. 1e308 is no float);
        ``lo`` lands on ``start`` and ``hi`` on ``start + length``. For loops over many
        points, where a call per point would cost more than the arithmetic."""
        if self.log:
            origin = math.log10(self.lo)
            return True, origin, length / (math.log10(self.hi) - origin)
        origin = self.lo * 0.5
        return False, origin, length / (self.hi * 0.5 - origin)

    def ticks(self, count: int) -> tuple[list[float], float | None]:
        """The tick values (at most about ``count``) and their linear spacing (None: log)."""
        if self.log:
            return _log_ticks(self.lo, self.hi, count), None
        step = self.step or _round_step(self.hi - self.lo, count)
        if step is None:
            return [self.lo, self.hi], None
        first = math.ceil(self.lo / step - 1e-9)
        last = math.floor(self.hi / step + 1e-9)
        if last - first > 4 * count:  # not reached for a finite span; a guard, not a path
            return [self.lo, self.hi], None
        return [k * step or 0.0 for k in range(first, last + 1)], step  # 0.0: no "-0" label


def _round_step(span: float, count: int) -> float | None:
    """The smallest of 1, 2, 2.5, 5 times a power of ten that cuts ``span`` in at most
    ``count`` parts; None when ``span`` is no usable float."""
    raw = span / max(count, 1)
    if not (math.isfinite(raw) and raw > 0):
        return None
    magnitude = 10.0 ** math.floor(math.log10(raw))
    for multiple in (1.0, 2.0, 2.5, 5.0, 10.0):
        if multiple * magnitude >= raw * (1 - 1e-9):
            return multiple * magnitude
    return 10 * magnitude


def _log_ticks(lo: float, hi: float, count: int) -> list[float]:
    a, b = math.log10(lo), math.log10(hi)
    decades = list(range(math.ceil(a - 1e-9), math.floor(b + 1e-9) + 1))
    if len(decades) >= 3:
        every = math.ceil(len(decades) / max(count, 1))
        return [10.0**k for k in decades if k % every == 0]
    # Under three decades, powers of ten alone leave the axis nearly bare.
    for multiples in ((1.0, 2.0, 5.0), (1.0, 3.0)):
        ticks = [
            m * 10.0**k
            for k in range(math.floor(a), math.ceil(b) + 1)
            for m in multiples
            if lo <= m * 10.0**k <= hi
        ]
        if len(ticks) <= count + 2:
            break
    return ticks if len(ticks) >= 2 else [lo, hi]


def tick_labels(ticks: Sequence[float], step: float | None = None) -> list[str]:
    """The labels of an axis' ticks, in one style for the whole axis: ``0.25``, ``1.5k``,
    or ``5e-4`` when every tick is under 0.01. ``step``, the spacing of a linear axis'
    ticks, sets the decimals, the same for every tick (``0.25``, ``0.50``); without it
    (a log axis) three significant digits, trailing zeros dropped."""
    small = 0 < max((abs(t) for t in ticks), default=0.0) < 1e-2
    return [tick_label(t, step, small) for t in ticks]


def tick_label(value: float, step: float | None = None, exponent: bool = False) -> str:
    """One tick's label (see ``tick_labels``); ``exponent``: write it as ``5e-4``."""
    if value == 0:
        return "0"
    size = abs(value)
    if not exponent and 1e-3 <= size < 1e3:
        return _fixed(value, step, strip=step is None)
    if not exponent and 1e3 <= size < 1000.0 ** len(_SUFFIXES):
        power = min(int(math.log10(size) // 3), len(_SUFFIXES) - 1)
        scale = 1000.0**power
        scaled_step = None if step is None else step / scale
        return _fixed(value / scale, scaled_step, strip=True) + _SUFFIXES[power]
    digits = 3
    if step is not None and step > 0:
        digits = math.floor(math.log10(size)) - math.floor(math.log10(step)) + 1 + _extra(step)
    return _exponent(value, min(max(digits, 1), 6))


def _extra(step: float) -> int:
    """One more digit for a step of 2.5 times a power of ten."""
    mantissa = step / 10.0 ** math.floor(math.log10(step))
    return 0 if abs(mantissa - round(mantissa)) < 1e-6 else 1


def _fixed(value: float, step: float | None, strip: bool) -> str:
    if step is not None and step > 0:
        decimals = max(0, -math.floor(math.log10(step)) + _extra(step))
    else:
        decimals = max(0, 2 - math.floor(math.log10(abs(value))))
    text = f"{value:.{min(decimals, 12)}f}"
    if strip and "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def _exponent(value: float, digits: int) -> str:
    """``1.5e-4`` rather than ``1.50e-04``."""
    mantissa, exponent = f"{value:.{digits - 1}e}".split("e")
    if "." in mantissa:
        mantissa = mantissa.rstrip("0").rstrip(".")
    return f"{mantissa}e{int(exponent)}"


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
