"""Kernel display: one block per rank in the cell output, updated in place, and a chart footer.

``KernelDisplay`` records a run's events in its ``RunModel``; ``refresh()`` draws what changed, at
most once per ``interval`` (``chart_interval`` for the chart). A block shows the last ``tail``
lines as a terminal would (``Screen``); ranks outside ``live`` show their header only. Blocks are
drawn in the cell running when drawn, unless ``pin()`` drew them in the launching cell: then any
thread only updates them by display id. IPython is imported only when drawing.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TextIO, cast

from nbddp.display import blocks
from nbddp.display.blocks import Bundle
from nbddp.display.chart import chart_html, chart_text, metric_summary
from nbddp.display.model import RankModel, RunModel
from nbddp.launcher.events import RankEnd
from nbddp.wire.protocol import MetricRow


class Publisher(Protocol):
    """Where blocks are drawn: IPython's display machinery, or a fake in tests."""

    def show(self, bundle: Bundle) -> object:
        """Draw a new block in the running cell; return a handle for ``update``."""

    def update(self, handle: object, bundle: Bundle) -> None:
        """Replace the block ``handle`` in place, wherever it is shown."""

    def cell(self) -> object:
        """A token that changes when a different cell is running."""


class _DisplayHandle(Protocol):
    """What ``IPythonPublisher.show`` returns: IPython's ``DisplayHandle``."""

    def update(self, obj: Bundle, *, raw: bool) -> None: ...


class IPythonPublisher:
    """Blocks as display ids (``display(..., display_id=True)`` / ``handle.update``)."""

    def show(self, bundle: Bundle) -> object:
        from IPython.display import display

        return display(bundle, raw=True, display_id=True)  # type: ignore[no-untyped-call]

    def update(self, handle: object, bundle: Bundle) -> None:
        cast(_DisplayHandle, handle).update(bundle, raw=True)

    def cell(self) -> object:
        """The running cell's execution count."""
        from IPython import get_ipython

        return getattr(get_ipython(), "execution_count", None)


@dataclass
class _Drawn:
    """What the notebook holds of one block."""

    handle: object = None
    shown: Bundle = field(default_factory=dict)


class KernelDisplay:
    """Per-rank blocks and a footer in the cell."""

    # The recording events are the model's own methods (``RunModel.output``,
    # ``.state``, ``.metric``, ``.ended``), bound per instance: they run per printed
    # line and per metric row, and a forwarding method would add a call to each.
    output: Callable[[int, str, str], None]
    state: Callable[[int, str], None]
    metric: Callable[[int, MetricRow], None]
    ended: Callable[[RankEnd], None]

    def __init__(
        self,
        live: set[int] | None = None,
        tail: int = 40,
        interval: float = 0.1,
        chart_interval: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
        publisher: Publisher | None = None,
        err: TextIO | None = None,
    ) -> None:
        self.model = model = RunModel(tail, live, interval, chart_interval, clock)
        self.output, self.state, self.metric = model.output, model.state, model.metric
        self.ended = model.ended
        self._publisher: Publisher = publisher or IPythonPublisher()
        self._err = err
        self._fold = uuid.uuid4().hex[:12]  # names this display's folds in the page
        self._drawn: dict[int, _Drawn] = {}
        self._footer = _Drawn()
        self._starting: object = None  # the "starting…" line's handle, until rank 0 takes it
        self._cell: object = None
        self._pinned = False
        self._attached = False
        self._notices: list[str] = []
        self._footer_dirty = False
        self._charted: dict[int, str] = {}  # rank -> the metric shown, as of the last chart
        self._chart: tuple[str, str] = ("", "")  # the last chart drawn: text, HTML
        self._retired: str | None = None

    # -- events (cheap: record only) ----------------------------------------

    def attach(self, log_dir: Path, world_size: int) -> None:
        """Learn where the logs are and how many ranks to draw, in rank order."""
        self.model.attach(log_dir, world_size)
        self._attached = True

    def notice(self, text: str) -> None:
        """A message from nbddp itself: in the footer once the cell shows the run
        (its "starting…" line or its blocks), else on stderr at once."""
        if self._attached or self._starting is not None:
            self._notices.append(text)
            self._footer_dirty = True
            return
        self._write(text)

    def _write(self, text: str) -> None:
        target = self._err or sys.stderr
        target.write(f"nbddp: {text}\n")
        target.flush()

    # -- where the blocks go --------------------------------------------------

    def starting(self, world_size: int) -> None:
        """Show "starting N ranks…" in the running cell until the ranks' blocks come."""
        self._cell = self._publisher.cell()
        self._starting = self._publisher.show(blocks.starting_bundle(world_size))

    def not_started(self) -> None:
        """The ranks never started: remove the "starting…" line (the error says why);
        notices that were waiting for the blocks go to stderr."""
        handle, self._starting = self._starting, None
        notices, self._notices = self._notices, []
        if handle is not None:
            self._publisher.update(handle, blocks.EMPTY)
        for text in notices:
            self._write(text)

    def pin(self) -> None:
        """Draw every block now, in the running cell; from now on only update them, by
        display id, from any thread."""
        self._cell = self._publisher.cell()
        self._pinned = True
        self.model.mark_dirty()
        self._draw(force=True)
        self.model.limiter.fire()

    def retire(self, note: str) -> None:
        """The display failed: draw headers only, with ``note``, from now on."""
        self._retired = note
        self.model.mark_dirty()
        self._draw(force=True)

    # -- drawing --------------------------------------------------------------

    def refresh(self) -> float | None:
        """Draw what changed if the rate limit allows; seconds until the next call is useful."""
        if self.model.limiter.try_fire():
            self._draw(force=False)
        return self.model.next_draw(self._footer_dirty)

    def close(self) -> None:
        """Draw the final frame (the run's output is complete); safe to call again."""
        model = self.model
        model.mark_dirty()
        # Whatever an interrupted draw left half done is drawn again (only what
        # differs from what the notebook holds is sent).
        model.chart_dirty = model.chart_dirty or bool(self._charted)
        self._footer_dirty = True
        self._draw(force=True)

    def _draw(self, force: bool) -> None:
        model = self.model
        if not self._pinned:
            cell = self._publisher.cell()
            if cell != self._cell:
                # A different cell is waiting now: draw fresh blocks there.
                self._cell = cell
                self._drawn.clear()
                self._footer = _Drawn()
                self._starting = None
                model.mark_dirty()
                model.chart_dirty = model.chart_dirty or bool(self._charted)
                self._footer_dirty = bool(self._notices)
        chart = self._retired is None and (
            model.chart_dirty and (force or model.chart_limiter.try_fire())
        )
        if chart:
            # The headers show the metrics of this chart, drawn in the same frame.
            model.chart_dirty = False
            self._charted = {
                rank: metric_summary(entry.metric)
                for rank, entry in model.ranks.items()
                if entry.metric is not None
            }
        now = model.clock()
        for entry in model.ranks.values():
            self._publish_block(entry, now)
        if chart or self._footer_dirty or (self._pinned and self._footer.handle is None):
            self._footer_dirty = False
            self._publish_footer(chart)

    def _publish_block(self, entry: RankModel, now: float) -> None:
        if not entry.stale(now):
            return  # nothing new, and the elapsed time shows the same
        entry.drawn(now)
        drawn = self._drawn.get(entry.rank)
        if drawn is None:
            drawn = self._drawn[entry.rank] = _Drawn()
            if entry.rank == 0 and self._starting is not None:
                drawn.handle, self._starting = self._starting, None  # replaces "starting…"
        self._publish(drawn, self._bundle(entry, now))

    def _publish_footer(self, chart: bool) -> None:
        if chart:
            history = self.model.history
            # The one place the chart is drawn: its text and HTML together.
            self._chart = (chart_text(history), chart_html(history))
        bundle = blocks.footer_bundle(self._notices, *self._chart)
        if self._footer.handle is None and not self._pinned and not bundle["text/plain"]:
            return  # nothing to show yet
        self._publish(self._footer, bundle)

    def _publish(self, drawn: _Drawn, bundle: Bundle) -> None:
        if bundle == drawn.shown:
            return
        if drawn.handle is None:
            drawn.handle = self._publisher.show(bundle)
        else:
            self._publisher.update(drawn.handle, bundle)
        drawn.shown = bundle

    def _bundle(self, entry: RankModel, now: float) -> Bundle:
        rank = entry.rank
        metric = self._charted.get(rank, "")
        header = blocks.header_text(rank, entry.words(), entry.elapsed_text(now), metric)
        log = self.model.log(rank)
        if self._retired is not None:
            return blocks.headers_only_bundle(
                rank=rank, state=entry.state, header=header, note=self._retired, log=log
            )
        return blocks.rank_bundle(
            rank=rank,
            state=entry.state,
            header=header,
            lines=entry.lines(),
            hidden=entry.hidden,
            log=log,
            fold=f"{self._fold}-{rank}",
            asked=entry.asked,
        )
