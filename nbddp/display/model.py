"""The per-rank view model the kernel display and the panel render: what each rank is doing,
and what changed since the last draw.

``RunModel`` records the ``Display`` events in a ``RankModel`` per rank and the run's ``history``,
rate limiters and dirty flags; renderers decide when to draw and say what they drew
(``RankModel.drawn``). The event methods run once per line and per row, so they only record.
``RateLimiter`` paces redraws and drops nothing: callers keep a dirty flag, draw when allowed,
and always at the end.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from nbddp.display.blocks import state_words
from nbddp.display.chart import MetricHistory, metric_summary
from nbddp.display.screen import Screen
from nbddp.launcher.events import RankEnd, RankState
from nbddp.launcher.logs import rank_log
from nbddp.launcher.run import format_elapsed
from nbddp.wire.protocol import MetricRow

# A state's name -> its member (members hash as their names, so they find
# themselves): a dict lookup, where ``RankState(name)`` costs ten times more.
_STATES: dict[str, RankState] = {state.value: state for state in RankState}


class RankModel:
    """One rank as the displays know it."""

    def __init__(self, rank: int, screen: Screen | None, started_at: float) -> None:
        self.rank = rank
        self.screen = screen
        """Its recent output as a terminal shows it; None: not shown live."""
        self.state = RankState.STARTING
        """Where it is: starting, running, then how it ended (``RankState``)."""
        self.detail = ""
        """What its ended state alone does not say (``RankEnd.detail``)."""
        self.started_at = started_at
        self.ended_at: float | None = None
        """When it was first seen in an ended state."""
        self.metric: MetricRow | None = None
        """Its latest metric row."""
        self.asked = False
        """It has waited for input: the prompt's transcript stays in view."""
        self.dirty = True
        """Something of this rank changed since it was last drawn."""
        self._drawn_elapsed = ""

    def elapsed(self, now: float) -> float:
        """Seconds from the run's start until ``now``, or until it ended."""
        end = self.ended_at if self.ended_at is not None else now
        return end - self.started_at

    def elapsed_text(self, now: float) -> str:
        """``elapsed`` as shown (``format_elapsed``)."""
        return format_elapsed(self.elapsed(now))

    def words(self) -> str:
        """Its state as a header says it (``style.state_words``)."""
        return state_words(self.state, self.detail)

    def summary(self) -> str:
        """The latest metric row in one line (``metric_summary``), or empty."""
        return metric_summary(self.metric) if self.metric is not None else ""

    def lines(self) -> list[str]:
        """The shown tail of its output (none when not shown live)."""
        return self.screen.lines() if self.screen is not None else []

    @property
    def hidden(self) -> int:
        """Lines older than the shown tail: only in its log."""
        return self.screen.hidden if self.screen is not None else 0

    def stale(self, now: float) -> bool:
        """True if a draw now would show something else than the last one."""
        return self.dirty or self.elapsed_text(now) != self._drawn_elapsed

    def drawn(self, now: float) -> None:
        """The renderer drew this rank as it is at ``now``."""
        self.dirty = False
        self._drawn_elapsed = self.elapsed_text(now)


class RunModel:
    """Every rank of one run, and the run's metrics and redraw pacing."""

    def __init__(
        self,
        tail: int = 40,
        live: set[int] | None = None,
        interval: float = 0.1,
        chart_interval: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.tail = tail
        self.live = live
        """Ranks whose output is kept on a ``Screen``; None: every rank."""
        self.clock = clock
        self.limiter = RateLimiter(interval, clock)
        """Paces redraws of the ranks."""
        self.chart_limiter = RateLimiter(chart_interval, clock)
        """Paces redraws of the metric chart (0: as often as the ranks)."""
        self.started = clock()
        self.ranks: dict[int, RankModel] = {}
        """Rank -> its model, in the order the ranks were first seen."""
        self.chart_dirty = False
        """Metric rows arrived since the chart was last drawn."""
        self.log_dir: Path | None = None
        self._history = MetricHistory()
        self._new_rows: list[MetricRow] = []  # not yet in ``_history``

    # -- events (record only) ------------------------------------------------

    def attach(self, log_dir: Path, world_size: int) -> None:
        """The run's log directory; a model for every rank, in rank order."""
        self.log_dir = log_dir
        for rank in range(world_size):
            self.rank(rank)

    def output(self, rank: int, stream: str, text: str) -> None:
        """Apply ``text`` to the rank's screen (not shown live: ignored, it is logged)."""
        entry = self.ranks.get(rank) or self.rank(rank)
        if entry.screen is not None:
            entry.screen.feed(text, stream)
            entry.dirty = True

    def state(self, rank: int, state: str) -> None:
        """Record the rank's new state (and when it first ended; a rank running
        again, restarted, has not ended)."""
        entry = self.rank(rank)
        entry.state = new = _STATES[state]
        entry.asked = entry.asked or new is RankState.WAITING
        if not new.ended:
            entry.ended_at = None
            entry.detail = ""
        elif entry.ended_at is None:
            entry.ended_at = self.clock()
        entry.dirty = True

    def ended(self, end: RankEnd) -> None:
        """Record how the rank ended, once its run is over: the refined state, its
        detail, and when it ended (when ``end`` knows; else when first seen ended)."""
        entry = self.rank(end.rank)
        self.state(end.rank, end.state)
        entry.detail = end.detail
        if end.ended_at is not None:
            entry.ended_at = end.ended_at

    def metric(self, rank: int, row: MetricRow) -> None:
        """Record a metric row: the rank's latest, and one more for the chart."""
        self._new_rows.append(row)
        entry = self.ranks.get(rank) or self.rank(rank)
        entry.metric = row
        entry.dirty = True
        self.chart_dirty = True

    # -- what renderers read -------------------------------------------------

    def rank(self, rank: int) -> RankModel:
        """The model of ``rank``, made on first use."""
        entry = self.ranks.get(rank)
        if entry is None:
            log = self.log(rank)
            screen = Screen(self.tail, where=str(log or "the log")) if self.shows(rank) else None
            entry = self.ranks[rank] = RankModel(rank, screen, self.started)
        return entry

    def shows(self, rank: int) -> bool:
        """True if ``rank``'s output is shown live."""
        return self.live is None or rank in self.live

    @property
    def history(self) -> MetricHistory:
        """Every metric row so far, as chart series."""
        if self._new_rows:
            # Taken in here, at draw time, all at once: ``metric`` stays an append.
            self._history.add_many(self._new_rows)
            self._new_rows.clear()
        return self._history

    def log(self, rank: int) -> Path | None:
        """The file that keeps everything ``rank`` wrote (None before ``attach``)."""
        return rank_log(self.log_dir, rank) if self.log_dir is not None else None

    def changed(self) -> bool:
        """True if any rank changed since it was last drawn."""
        return any(entry.dirty for entry in self.ranks.values())

    def stale(self, now: float) -> bool:
        """True if drawing the ranks now would show anything new (elapsed times included)."""
        return any(entry.stale(now) for entry in self.ranks.values())

    def running(self) -> bool:
        """True while some rank has not ended."""
        return any(not entry.state.ended for entry in self.ranks.values())

    def next_draw(self, pending: bool = False) -> float | None:
        """Seconds until a draw would show something new (None: nothing will): a change
        (``pending``: one the renderer keeps) once ``limiter`` allows, else the chart once
        ``chart_limiter`` allows, or the elapsed times when they tick over."""
        delay = self.limiter.delay()
        if pending or self.changed():
            return delay
        wanted = [self.chart_limiter.delay()] if self.chart_dirty else []
        if self.running():
            wanted.append(self.tick_delay())
        return max(delay, min(wanted)) if wanted else None

    def tick_delay(self) -> float:
        """Seconds until the elapsed times next tick over."""
        return 1.0 - (self.clock() - self.started) % 1.0

    def mark_dirty(self) -> None:
        """Every rank must be drawn again (its earlier drawing is gone)."""
        for entry in self.ranks.values():
            entry.dirty = True


class RateLimiter:
    """Allows one event per ``interval`` seconds of ``clock``."""

    def __init__(self, interval: float, clock: Callable[[], float] = time.monotonic) -> None:
        if interval < 0:
            raise ValueError(f"interval must be >= 0, not {interval}")
        self.interval = interval
        self.clock = clock
        self._last: float | None = None

    def delay(self) -> float:
        """Seconds until ``ready()`` (0.0 when it already is)."""
        return 0.0 if self._last is None else max(0.0, self._last + self.interval - self.clock())

    def ready(self) -> bool:
        """True if an event may happen now."""
        return self.delay() <= 0.0

    def fire(self) -> None:
        """Record that the event happened now."""
        self._last = self.clock()

    def try_fire(self) -> bool:
        """``fire()`` and return True if ``ready()``; else False."""
        if not self.ready():
            return False
        self.fire()
        return True
