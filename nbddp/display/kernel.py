"""Kernel display: one block per rank in the cell output, updated in place.

Contract: ``KernelDisplay`` receives a run's events (``output``, ``state``,
``metric``) and only records them, in its view model (``model``, a
``RunModel``); ``refresh()`` draws what changed, at most once per
``interval`` seconds, and says when it next wants to be called; ``close()``
draws everything a last time, so output written just before a rank exits
is always shown. Each rank's block is a display
id updated in place (``text/plain`` and a small ``text/html``), with a
header (rank, state, elapsed time, last metric) over the last ``tail``
lines of the rank's output as a terminal would show them (``Screen``), so
tqdm bars redraw in place. Lines beyond the tail are only in the rank's
log, and the block says so. Ranks outside ``live`` show their header only.
Metric rows also feed a chart block (inline SVG, ``chart``), drawn at most
once per ``chart_interval`` seconds.

All drawing happens in the thread that calls ``refresh``/``close`` (the
cell's thread, so outputs land in the cell that waits). If ``refresh`` runs
in a later cell than the one that drew the blocks (``run.wait()`` called
again), the blocks are drawn anew in that cell. Notices go to stderr.

IPython is imported only when the first block is drawn.
"""

from __future__ import annotations

import html
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TextIO

from nbddp.display.chart import chart_html, chart_text
from nbddp.display.model import RankModel, RunModel
from nbddp.display.style import STATE_COLORS
from nbddp.wire.protocol import MetricRow

Bundle = dict[str, str]


class Publisher(Protocol):
    """Where blocks are drawn: IPython's display machinery, or a fake in tests."""

    def show(self, bundle: Bundle) -> Any:
        """Draw a new block; return a handle for ``update``."""

    def update(self, handle: Any, bundle: Bundle) -> None:
        """Replace the block ``handle`` in place."""

    def cell(self) -> object:
        """A token that changes when a different cell is running."""


class IPythonPublisher:
    """Blocks as display ids (``display(..., display_id=True)`` / ``handle.update``)."""

    def show(self, bundle: Bundle) -> Any:
        """Draw a new block in the running cell's output."""
        from IPython.display import display

        return display(bundle, raw=True, display_id=True)  # type: ignore[no-untyped-call]

    def update(self, handle: Any, bundle: Bundle) -> None:
        """Update a block wherever it is shown."""
        handle.update(bundle, raw=True)

    def cell(self) -> object:
        """The running cell's execution count."""
        from IPython import get_ipython

        shell = get_ipython()
        return getattr(shell, "execution_count", None)


@dataclass
class _Drawn:
    """What the notebook holds of one rank's block."""

    handle: Any = None
    shown: dict[str, str] = field(default_factory=dict)


class KernelDisplay:
    """Per-rank blocks and a metrics chart in the cell (see module contract)."""

    # The recording events are the model's own methods (``RunModel.output``,
    # ``.state``, ``.metric``), bound per instance: they run per printed line
    # and per metric row, and a forwarding method would add a call to each.
    output: Callable[[int, str, str], None]
    state: Callable[[int, str], None]
    metric: Callable[[int, MetricRow], None]

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
        self.tail = tail
        self.model = model = RunModel(tail, live, interval, chart_interval, clock)
        self.output, self.state, self.metric = model.output, model.state, model.metric
        self._publisher: Publisher = publisher or IPythonPublisher()
        self._err = err
        self._drawn: dict[int, _Drawn] = {}
        self._chart_handle: Any = None
        self._cell: object = None

    # -- events (cheap: record only) ----------------------------------------

    def attach(self, log_dir: Path, world_size: int) -> None:
        """Learn where the logs are and how many ranks to draw, in rank order."""
        self.model.attach(log_dir, world_size)

    def notice(self, text: str) -> None:
        """A message from nbddp itself, written to stderr at once."""
        target = self._err or sys.stderr
        target.write(f"nbddp: {text}\n")
        target.flush()

    # -- drawing --------------------------------------------------------------

    def refresh(self) -> float | None:
        """Draw what changed if the rate limit allows; seconds until the next call is useful."""
        if self.model.limiter.try_fire():
            self._draw(force=False)
        return self._next_refresh()

    def close(self) -> None:
        """Draw everything one last time (the run's output is complete)."""
        self._draw(force=True)

    def _draw(self, force: bool) -> None:
        model = self.model
        history = model.history
        cell = self._publisher.cell()
        if cell != self._cell:
            # A different cell is waiting now: draw fresh blocks there.
            self._cell = cell
            self._drawn.clear()
            model.mark_dirty()
            self._chart_handle = None
            model.chart_dirty = bool(history)
        now = model.clock()
        for entry in model.ranks.values():
            self._publish_block(entry, now)
        if model.chart_dirty and (force or model.chart_limiter.try_fire()):
            model.chart_dirty = False
            bundle = {"text/plain": chart_text(history), "text/html": chart_html(history)}
            if self._chart_handle is None:
                self._chart_handle = self._publisher.show(bundle)
            else:
                self._publisher.update(self._chart_handle, bundle)

    def _publish_block(self, entry: RankModel, now: float) -> None:
        if not entry.stale(now):
            return  # nothing new, and the elapsed time shows the same
        entry.drawn(now)
        drawn = self._drawn.get(entry.rank)
        if drawn is None:
            drawn = self._drawn[entry.rank] = _Drawn()
        bundle = self._bundle(entry, now)
        if bundle == drawn.shown:
            return
        if drawn.handle is None:
            drawn.handle = self._publisher.show(_mime(bundle))
        else:
            self._publisher.update(drawn.handle, _mime(bundle))
        drawn.shown = bundle

    def _next_refresh(self) -> float | None:
        model = self.model
        delay = model.limiter.delay()
        wanted = []
        if model.changed():
            wanted.append(delay)
        if model.chart_dirty:
            wanted.append(max(delay, model.chart_limiter.delay()))
        if model.running():
            # Redraw headers when the elapsed seconds tick over.
            wanted.append(max(delay, model.tick_delay()))
        return min(wanted) if wanted else None

    def _bundle(self, entry: RankModel, now: float) -> dict[str, str]:
        parts = [f"rank {entry.rank}", entry.state.value, entry.elapsed_text(now)]
        if entry.metric is not None:
            parts.append(entry.summary())
        header = " · ".join(parts)
        bundle = {"plain": header, "html": _html_header(entry.state, header)}
        if entry.screen is None:
            return bundle
        lines = entry.lines()
        if entry.hidden:
            where = self.model.log(entry.rank) or "its log"
            lines = [f"… {entry.hidden:,} earlier lines in {where}", *lines]
        if lines:
            text = "\n".join(lines)
            bundle["plain"] = f"{header}\n{text}"
            bundle["html"] += (
                '<pre style="margin:0 0 4px 0;padding:2px 6px;white-space:pre-wrap;'
                f'word-break:break-all">{html.escape(text)}</pre>'
            )
        return bundle


def _html_header(state: str, header: str) -> str:
    color = STATE_COLORS.get(state)
    style = "font-family:monospace;font-weight:bold;padding:1px 0"
    if color:
        style += f";color:{color}"
    return f'<div style="{style}">{html.escape(header)}</div>'


def _mime(bundle: dict[str, str]) -> Bundle:
    return {"text/plain": bundle["plain"], "text/html": f"<div>{bundle['html']}</div>"}
