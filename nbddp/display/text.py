"""Text display: rank-prefixed lines, for terminals, scripts and plain kernels.

Contract: ``TextDisplay.output(rank, stream, text)`` accepts chunks as they
arrive and writes only whole lines, each prefixed ``[rank N] `` and written
with one ``write`` call, so ranks never interleave mid-line. A carriage
return rewinds the current line as a terminal would: of ``"a\\rb\\n"`` only
``b`` is printed, so a tqdm bar appears as its final state, not as a line
per redraw; while a bar is still running, its current state is printed
at most every ``progress_interval`` seconds so a long loop shows progress.
ANSI cursor movement (tqdm's nested bars) is removed: on a shared terminal
it would move over other ranks' lines. ``close()`` writes what is left of
unfinished lines. Nothing a rank writes is dropped.

Metric rows print as ``[rank N] step 10 loss=0.123``: immediately, or if
the rank's last metric line is younger than ``metric_interval`` seconds,
its latest row once that time has passed (``refresh``) and at ``close``.
Every row is kept in ``Run.metrics`` regardless.

Unlike the kernel display and the panel, it keeps no ``model.RunModel``:
what it writes is final the moment a line completes, so it has no screens
to redraw, no elapsed times and nothing to compare with a last draw; per
rank it holds only an unfinished line per stream and a held metric row.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from nbddp.display.chart import metric_summary
from nbddp.display.ratelimit import RateLimiter
from nbddp.display.screen import strip_cursor_codes


def apply_carriage_returns(line: str) -> str:
    """What a terminal shows for ``line`` (no newline inside): the text after the last
    ``\\r`` overwrites the start of what came before it."""
    if "\r" not in line:
        return strip_cursor_codes(line)
    shown = ""
    for segment in line.split("\r"):
        shown = segment + shown[len(segment) :]
    return strip_cursor_codes(shown)


class LineAssembler:
    """Turns chunks into complete lines, per (rank, stream)."""

    def __init__(self) -> None:
        self._partial: dict[tuple[int, str], str] = {}

    def feed(self, rank: int, stream: str, text: str) -> list[str]:
        """Complete lines (without their newline) now available for this stream."""
        key = (rank, stream)
        buf = self._partial.get(key, "") + text
        *lines, rest = buf.split("\n")
        cut = rest.rfind("\r")
        if cut > 0:
            # A bar redrawn for an hour without a newline must not grow without
            # bound: settle what is before the last \r (the cursor is then at 0).
            rest = apply_carriage_returns(rest[:cut]) + rest[cut:]
        self._partial[key] = rest
        return [apply_carriage_returns(line) for line in lines]

    def has_progress(self) -> bool:
        """True if an unfinished line is being redrawn (holds a ``\\r``): a progress bar."""
        return any("\r" in rest for rest in self._partial.values())

    def progress(self) -> list[tuple[int, str, str]]:
        """The unfinished lines being redrawn, as (rank, stream, what a terminal shows)."""
        return [
            (rank, stream, apply_carriage_returns(rest).rstrip())
            for (rank, stream), rest in sorted(self._partial.items())
            if "\r" in rest
        ]

    def drain(self) -> list[tuple[int, str, str]]:
        """Every unfinished line, as (rank, stream, line); the buffers are emptied."""
        out = [
            (rank, stream, apply_carriage_returns(rest))
            for (rank, stream), rest in sorted(self._partial.items())
            if apply_carriage_returns(rest)
        ]
        self._partial.clear()
        return out


class TextDisplay:
    """Rank-prefixed lines on ``out``/``err`` (defaults: the caller's stdout/stderr)."""

    def __init__(
        self,
        out: TextIO | None = None,
        err: TextIO | None = None,
        ranks: set[int] | None = None,
        metric_interval: float = 1.0,
        progress_interval: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._out = out
        self._err = err
        self._ranks = ranks  # None: every rank
        self._lines = LineAssembler()
        self._clock = clock
        self._metric_interval = metric_interval
        self._metric_limiters: dict[int, RateLimiter] = {}
        self._pending_metrics: dict[int, dict[str, Any]] = {}
        self._progress_limiter = RateLimiter(progress_interval, clock)
        self._progress_limiter.fire()  # the first snapshot after one interval
        self._progress_shown: dict[tuple[int, str], str] = {}

    def _stream(self, stream: str) -> TextIO:
        if stream == "stderr":
            return self._err or sys.stderr
        return self._out or sys.stdout

    def output(self, rank: int, stream: str, text: str) -> None:
        """Show the complete lines in ``text`` (see module contract)."""
        if self._ranks is not None and rank not in self._ranks:
            return
        lines = self._lines.feed(rank, stream, text)
        if lines:
            self._progress_shown.pop((rank, stream), None)
            self._write(stream, "".join(f"[rank {rank}] {line}\n" for line in lines))

    def attach(self, log_dir: Path, world_size: int) -> None:
        """Nothing to prepare: lines are written as they come."""

    def notice(self, text: str) -> None:
        """A one-line message from nbddp itself."""
        self._write("stderr", f"nbddp: {text}\n")

    def state(self, rank: int, state: str) -> None:
        """Rank state changes are not shown as text (errors are raised instead)."""

    def metric(self, rank: int, row: dict[str, Any]) -> None:
        """Print ``row`` as one line, or keep it until the rank's rate limit allows."""
        if self._ranks is not None and rank not in self._ranks:
            return
        # Called for every row a rank logs: only this rank's limiter is asked.
        limiter = self._metric_limiters.get(rank)
        if limiter is None:
            limiter = self._metric_limiters[rank] = RateLimiter(self._metric_interval, self._clock)
        if limiter.try_fire():
            self._pending_metrics.pop(rank, None)
            self._write("stdout", f"[rank {rank}] {metric_summary(row)}\n")
        else:
            self._pending_metrics[rank] = row

    def refresh(self) -> float | None:
        """Print due metric lines and progress snapshots; seconds until the next is due."""
        self._print_metrics(force=False)
        progress = self._lines.has_progress()
        if progress and self._progress_limiter.try_fire():
            for rank, stream, line in self._lines.progress():
                if line and self._progress_shown.get((rank, stream)) != line:
                    self._progress_shown[(rank, stream)] = line
                    self._write(stream, f"[rank {rank}] {line}\n")
        delays = [self._metric_limiters[r].delay() for r in self._pending_metrics]
        if progress:
            delays.append(self._progress_limiter.delay())
        return min(delays) if delays else None

    def close(self) -> None:
        """Write unfinished lines and held metric rows; call once the output is complete."""
        for rank, stream, line in self._lines.drain():
            self._write(stream, f"[rank {rank}] {line}\n")
        self._print_metrics(force=True)
        for stream in ("stdout", "stderr"):
            self._stream(stream).flush()

    def _print_metrics(self, force: bool) -> None:
        for rank in sorted(self._pending_metrics):
            # A row is only held after its rank's limiter refused it: the limiter exists.
            if force or self._metric_limiters[rank].try_fire():
                row = self._pending_metrics.pop(rank)
                self._write("stdout", f"[rank {rank}] {metric_summary(row)}\n")

    def _write(self, stream: str, text: str) -> None:
        target = self._stream(stream)
        target.write(text)
        target.flush()
