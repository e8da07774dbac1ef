"""What the panel shows of a run while it goes on: the ``Display`` a panel run is fed.

Contract: ``PanelFeed`` implements ``display.protocol.Display``. Its event methods only
record (each rank's output goes into a ``Screen``, so ``\\r`` and tqdm's
cursor moves redraw in place and only the last ``tail`` lines are kept;
metric rows go into a ``MetricHistory``). ``refresh()`` hands the sink a
``RankView`` per rank and the chart's HTML, at most once per ``interval``
seconds and only when something changed (or the elapsed seconds ticked
over); ``close()`` hands over the final state unconditionally. The sink is
the panel's widgets, or a fake in tests; it is only ever called from the
thread that pumps the run. Nothing here imports ipywidgets.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from nbddp.display.chart import MetricHistory, chart_html, metric_summary
from nbddp.display.kernel import ENDED, format_elapsed
from nbddp.display.ratelimit import RateLimiter
from nbddp.display.screen import Screen


@dataclass(frozen=True)
class RankView:
    """One rank as the panel shows it."""

    rank: int
    state: str
    """starting, running, done, failed or stopped."""
    elapsed: str
    """Time since the run started, until this rank ended (``format_elapsed``)."""
    metric: str
    """The rank's latest metric row in one line (``metric_summary``), or empty."""
    lines: tuple[str, ...]
    """The last lines of its output, as a terminal would show them."""
    hidden: int
    """How many earlier lines are only in its log."""


class PanelSink(Protocol):
    """Where a ``PanelFeed`` draws (the panel's widgets)."""

    def show_ranks(self, ranks: list[RankView]) -> None:
        """Draw every rank's state, elapsed time, metric and output tail."""

    def show_chart(self, html: str) -> None:
        """Draw the metric chart (HTML with inline SVG)."""

    def show_notice(self, text: str) -> None:
        """Show a message from nbddp itself."""


@dataclass
class _Rank:
    screen: Screen
    state: str = "starting"
    ended_at: float | None = None
    metric: dict[str, Any] | None = None


class PanelFeed:
    """Records a run's events and draws them into a ``PanelSink`` (see module contract)."""

    def __init__(
        self,
        sink: PanelSink,
        tail: int = 40,
        interval: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.tail = tail
        self._sink = sink
        self._clock = clock
        self._limiter = RateLimiter(interval, clock)
        self._started = clock()
        self._ranks: dict[int, _Rank] = {}
        self._history = MetricHistory()
        self._dirty = True
        self._chart_dirty = False
        self._shown_elapsed: tuple[str, ...] = ()
        self.log_dir: Path | None = None

    # -- events (record only) ----------------------------------------------

    def attach(self, log_dir: Path, world_size: int) -> None:
        """The run's log directory and rank count."""
        self.log_dir = log_dir
        for rank in range(world_size):
            self._rank(rank)

    def output(self, rank: int, stream: str, text: str) -> None:
        """Apply ``text`` to the rank's screen."""
        self._rank(rank).screen.feed(text, stream)
        self._dirty = True

    def notice(self, text: str) -> None:
        """Pass nbddp's own message straight to the sink."""
        self._sink.show_notice(text)

    def state(self, rank: int, state: str) -> None:
        """Record the rank's new state."""
        entry = self._rank(rank)
        entry.state = state
        if state in ENDED and entry.ended_at is None:
            entry.ended_at = self._clock()
        self._dirty = True

    def metric(self, rank: int, row: dict[str, Any]) -> None:
        """Record a metric row for the rank's summary and the chart."""
        self._history.add(row)
        self._rank(rank).metric = row
        self._dirty = True
        self._chart_dirty = True

    # -- drawing ---------------------------------------------------------------

    def refresh(self) -> float | None:
        """Draw if something changed and the rate limit allows; seconds until next useful."""
        if self._limiter.ready() and (self._dirty or self._chart_dirty or self._ticked()):
            self._limiter.fire()
            self._draw()
        if any(r.state not in ENDED for r in self._ranks.values()):
            return max(self._limiter.delay(), 1.0 - (self._clock() - self._started) % 1.0)
        return self._limiter.delay() if self._dirty or self._chart_dirty else None

    def close(self) -> None:
        """Draw the final state (the run's output is complete)."""
        self._draw()

    def views(self) -> list[RankView]:
        """Every rank as it would be drawn now."""
        now = self._clock()
        views = []
        for rank, entry in sorted(self._ranks.items()):
            end = entry.ended_at if entry.ended_at is not None else now
            views.append(
                RankView(
                    rank=rank,
                    state=entry.state,
                    elapsed=format_elapsed(end - self._started),
                    metric=metric_summary(entry.metric) if entry.metric else "",
                    lines=tuple(entry.screen.lines()),
                    hidden=entry.screen.hidden,
                )
            )
        return views

    def _draw(self) -> None:
        views = self.views()
        self._dirty = False
        self._shown_elapsed = tuple(v.elapsed for v in views)
        self._sink.show_ranks(views)
        if self._chart_dirty:
            self._chart_dirty = False
            self._sink.show_chart(chart_html(self._history))

    def _ticked(self) -> bool:
        """True when a shown elapsed time would now read differently."""
        return tuple(v.elapsed for v in self.views()) != self._shown_elapsed

    def _rank(self, rank: int) -> _Rank:
        entry = self._ranks.get(rank)
        if entry is None:
            entry = self._ranks[rank] = _Rank(Screen(self.tail))
        return entry
