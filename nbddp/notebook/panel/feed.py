"""What the panel shows of a run while it goes on: the ``Display`` a panel run is fed.

``PanelFeed`` implements ``launcher.pump.Display``: its events only record, in a ``RunModel``;
``refresh()`` hands the sink a ``RankView`` per rank and the chart's HTML, at most once per
``interval`` and only when something changed; ``close()`` hands over the final state. The sink
(the panel's widgets, or a fake) is only called from the thread pumping the run. No ipywidgets.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from nbddp.display.chart import chart_html
from nbddp.display.model import RunModel
from nbddp.launcher.events import RankState
from nbddp.wire.protocol import MetricRow


@dataclass(frozen=True)
class RankView:
    """One rank as the panel shows it."""

    rank: int
    state: RankState
    """starting, running, done, failed or stopped."""
    elapsed: str
    """Time since the run started, until this rank ended (``format_elapsed``)."""
    metric: str
    """The rank's latest metric row in one line (``metric_summary``), or empty."""
    lines: tuple[str, ...]
    """The last lines of its output, as a terminal would show them."""
    hidden: int
    """How many earlier lines are only in its log."""
    log: Path | None = None
    """Its log file (``launcher.logs.rank_log``); None before the run's logs are known."""


class PanelSink(Protocol):
    """Where a ``PanelFeed`` draws (the panel's widgets)."""

    def show_ranks(self, ranks: list[RankView]) -> None:
        """Draw every rank's state, elapsed time, metric and output tail."""

    def show_chart(self, html: str) -> None:
        """Draw the metric chart (HTML with inline SVG)."""

    def show_notice(self, text: str) -> None:
        """Show a message from nbddp itself."""


class PanelFeed:
    """Records a run's events and draws them into a ``PanelSink``."""

    # The events are the model's own methods (nbddp's notices: the sink's), bound per
    # instance: they run per printed line and per metric row, so no forwarding call.
    attach: Callable[[Path, int], None]
    notice: Callable[[str], None]
    output: Callable[[int, str, str], None]
    state: Callable[[int, str], None]
    metric: Callable[[int, MetricRow], None]

    def __init__(
        self,
        sink: PanelSink,
        tail: int = 40,
        interval: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.model = model = RunModel(tail, interval=interval, clock=clock)
        self.attach, self.output = model.attach, model.output
        self.state, self.metric = model.state, model.metric
        self._sink, self.notice = sink, sink.show_notice

    # -- drawing ---------------------------------------------------------------

    def refresh(self) -> float | None:
        """Draw if something changed and the rate limit allows; seconds until next useful."""
        model = self.model
        limiter = model.limiter
        if limiter.ready() and (model.chart_dirty or model.stale(model.clock())):
            limiter.fire()
            self._draw()
        return model.next_draw()  # the panel's chart has no rate limit of its own

    def close(self) -> None:
        """Draw the final state (the run's output is complete)."""
        self._draw()

    def _draw(self) -> None:
        model = self.model
        now = model.clock()
        views = [
            RankView(
                rank=rank,
                state=entry.state,
                elapsed=entry.elapsed_text(now),
                metric=entry.summary(),
                lines=tuple(entry.lines()),
                hidden=entry.hidden,
                log=model.log(rank),
            )
            for rank, entry in sorted(model.ranks.items())
        ]
        for entry in model.ranks.values():
            entry.drawn(now)
        self._sink.show_ranks(views)
        if model.chart_dirty:
            model.chart_dirty = False
            self._sink.show_chart(chart_html(model.history))
