"""Kernel display: one block per rank in the cell output, updated in place.

Contract: ``KernelDisplay`` receives a run's events (``output``, ``state``,
``metric``, ``notice``) and only records them; ``refresh()`` draws what
changed, at most once per ``interval`` seconds, and says when it next wants
to be called; ``close()`` draws everything a last time, so output written
just before a rank exits is always shown. Each rank's block is a display
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

from nbddp.display.chart import MetricHistory, chart_html, chart_text, metric_summary
from nbddp.display.ratelimit import RateLimiter
from nbddp.display.screen import Screen

Bundle = dict[str, str]
ENDED = ("done", "failed", "stopped")
STATE_COLORS = {"done": "#2ca02c", "failed": "#d62728", "stopped": "#ff7f0e"}


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


def format_elapsed(seconds: float) -> str:
    """``7s``, ``3m05s`` or ``1h02m``."""
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


@dataclass
class _Block:
    rank: int
    screen: Screen | None  # None: not shown live
    state: str = "starting"
    ended_at: float | None = None
    metric: dict[str, Any] | None = None
    dirty: bool = True
    handle: Any = None
    shown: Bundle = field(default_factory=dict)


class KernelDisplay:
    """Per-rank blocks and a metrics chart in the cell (see module contract)."""

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
        self._live = live  # None: every rank
        self._clock = clock
        self._limiter = RateLimiter(interval, clock)
        self._chart_limiter = RateLimiter(chart_interval, clock)
        self._publisher: Publisher = publisher or IPythonPublisher()
        self._err = err
        self._started = clock()
        self._blocks: dict[int, _Block] = {}
        self._history = MetricHistory()
        self._new_rows: list[dict[str, Any]] = []  # not yet in ``_history``
        self._chart_handle: Any = None
        self._chart_dirty = False
        self._cell: object = None
        self._log_dir: Path | None = None

    # -- events (cheap: record only) ----------------------------------------

    def attach(self, log_dir: Path, world_size: int) -> None:
        """Learn where the logs are and how many ranks to draw, in rank order."""
        self._log_dir = log_dir
        for rank in range(world_size):
            self._block(rank)

    def output(self, rank: int, stream: str, text: str) -> None:
        """Apply ``text`` to the rank's screen (ranks not shown live: ignored, it is logged)."""
        block = self._block(rank)
        if block.screen is not None:
            block.screen.feed(text, stream)
            block.dirty = True

    def notice(self, text: str) -> None:
        """A message from nbddp itself, written to stderr at once."""
        target = self._err or sys.stderr
        target.write(f"nbddp: {text}\n")
        target.flush()

    def state(self, rank: int, state: str) -> None:
        """Record the rank's new state."""
        block = self._block(rank)
        block.state = state
        if state in ENDED and block.ended_at is None:
            block.ended_at = self._clock()
        block.dirty = True

    def metric(self, rank: int, row: dict[str, Any]) -> None:
        """Record a metric row for the header and the chart."""
        # Called for every row a rank logs: the chart takes rows in when it is
        # drawn (at most every ``chart_interval``), all at once.
        self._new_rows.append(row)
        block = self._blocks.get(rank) or self._block(rank)
        block.metric = row
        block.dirty = True
        self._chart_dirty = True

    # -- drawing --------------------------------------------------------------

    def refresh(self) -> float | None:
        """Draw what changed if the rate limit allows; seconds until the next call is useful."""
        if self._limiter.try_fire():
            self._draw(force=False)
        return self._next_refresh()

    def close(self) -> None:
        """Draw everything one last time (the run's output is complete)."""
        self._draw(force=True)

    def _draw(self, force: bool) -> None:
        if self._new_rows:
            self._history.add_many(self._new_rows)
            self._new_rows.clear()
        cell = self._publisher.cell()
        if cell != self._cell:
            # A different cell is waiting now: draw fresh blocks there.
            self._cell = cell
            for block in self._blocks.values():
                block.handle, block.shown = None, {}
            self._chart_handle = None
            self._chart_dirty = bool(self._history)
        for block in self._blocks.values():
            self._publish_block(block)
        if self._chart_dirty and (force or self._chart_limiter.try_fire()):
            self._chart_dirty = False
            bundle = {
                "text/plain": chart_text(self._history),
                "text/html": chart_html(self._history),
            }
            if self._chart_handle is None:
                self._chart_handle = self._publisher.show(bundle)
            else:
                self._publisher.update(self._chart_handle, bundle)

    def _publish_block(self, block: _Block) -> None:
        header = self._header(block)
        if not block.dirty and block.shown.get("header") == header:
            return  # nothing new, and the elapsed time shows the same
        block.dirty = False
        bundle = self._bundle(block, header)
        if bundle == block.shown:
            return
        if block.handle is None:
            block.handle = self._publisher.show(_mime(bundle))
        else:
            self._publisher.update(block.handle, _mime(bundle))
        block.shown = bundle

    def _next_refresh(self) -> float | None:
        wanted = []
        if any(b.dirty for b in self._blocks.values()):
            wanted.append(self._limiter.delay())
        if self._chart_dirty:
            wanted.append(max(self._limiter.delay(), self._chart_limiter.delay()))
        if any(b.state not in ENDED for b in self._blocks.values()):
            # Redraw headers when the elapsed seconds tick over.
            elapsed = self._clock() - self._started
            wanted.append(max(self._limiter.delay(), 1.0 - elapsed % 1.0))
        return min(wanted) if wanted else None

    def _header(self, block: _Block) -> str:
        end = block.ended_at if block.ended_at is not None else self._clock()
        parts = [f"rank {block.rank}", block.state, format_elapsed(end - self._started)]
        if block.metric is not None:
            parts.append(metric_summary(block.metric))
        return " · ".join(parts)

    def _bundle(self, block: _Block, header: str) -> dict[str, str]:
        bundle = {"header": header, "plain": header, "html": _html_header(block.state, header)}
        screen = block.screen
        if screen is None:
            return bundle
        lines = screen.lines()
        if screen.hidden:
            where = self._log_dir / f"rank{block.rank}.log" if self._log_dir else "its log"
            lines = [f"… {screen.hidden:,} earlier lines in {where}", *lines]
        if lines:
            text = "\n".join(lines)
            bundle["plain"] = f"{header}\n{text}"
            bundle["html"] += (
                '<pre style="margin:0 0 4px 0;padding:2px 6px;white-space:pre-wrap;'
                f'word-break:break-all">{html.escape(text)}</pre>'
            )
        return bundle

    def _block(self, rank: int) -> _Block:
        block = self._blocks.get(rank)
        if block is None:
            live = self._live is None or rank in self._live
            block = _Block(rank, Screen(self.tail) if live else None)
            self._blocks[rank] = block
        return block


def _html_header(state: str, header: str) -> str:
    color = STATE_COLORS.get(state)
    style = "font-family:monospace;font-weight:bold;padding:1px 0"
    if color:
        style += f";color:{color}"
    return f'<div style="{style}">{html.escape(header)}</div>'


def _mime(bundle: dict[str, str]) -> Bundle:
    return {"text/plain": bundle["plain"], "text/html": f"<div>{bundle['html']}</div>"}
