"""The axes of a metric chart: which scale a metric gets (``choose_scale``), where its ticks go
(``Axis``), their labels (``tick_labels``). Values are finite floats; a range no float can span
ticks only its ends."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

ScaleKind = Literal["linear", "log"]

LOG_MIN_RATIO = 10.0
"""A metric is drawn on a log axis only if its largest value is this many times its smallest."""
_LOG_PAD = 0.04  # of the log axis' span, above and below the values, so no line hugs a border
_SUFFIXES = ("", "k", "M", "G", "T", "P", "E")


def choose_scale(values: Sequence[float]) -> ScaleKind:
    """``"log"`` when all ``values`` are positive, span at least ``LOG_MIN_RATIO`` and a linear
    axis would press most into its bottom quarter; else ``"linear"``."""
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
        """An axis over ``values`` (log: their range with a little room; linear: widened to
        about ``count`` round ticks; ``exact``: their range)."""
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
        """``(log, origin, k)`` placing a value ``v`` at pixel ``start + (t - origin) * k``,
        where ``t`` is ``log10(v)`` on a log axis and ``v * 0.5`` on a linear one (halves: the
        span of -1e308 .. 1e308 is no float); ``lo`` lands on ``start``, ``hi`` on ``start +
        length``. For loops over many points, where a call per point costs more than the sum."""
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
    """The labels of an axis' ticks, in one style for the whole axis: ``0.25``, ``1.5k``, or
    ``5e-4`` when every tick is under 0.01. ``step``, a linear axis' tick spacing, sets the
    decimals for every tick (``0.25``, ``0.50``); without it, three significant digits."""
    small = 0 < max((abs(t) for t in ticks), default=0.0) < 1e-2
    return [_label(t, step, small) for t in ticks]


def _label(value: float, step: float | None, exponent: bool) -> str:
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
