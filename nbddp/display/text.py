"""Text display: rank-prefixed lines, for terminals, scripts and plain kernels.

``TextDisplay`` writes only whole lines, each ``[rank N] ``-prefixed in one ``write``, so ranks
never interleave mid-line. ``\r`` rewinds as a terminal would (a running tqdm bar prints at most
every ``progress_interval``); cursor moves are removed; lines are cut at ``width``. Metric rows
print at once, or at most every ``metric_interval`` per rank (``refresh``, ``close``). ``close()``
writes what is left. It keeps no ``RunModel``: what it writes is final once a line completes.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from nbddp.display.chart import metric_summary
from nbddp.display.model import RateLimiter
from nbddp.display.screen import strip_cursor_codes
from nbddp.launcher.logs import rank_log
from nbddp.wire.protocol import MetricRow

TEXT_WIDTH = 10_000
"""Characters of one line the text display writes; the rest is in the rank's log."""
_TRAILING_ESCAPE = re.compile(r"\x1b[^A-Za-z\x07]*\Z")
_CONTROL = re.compile(r"[\r\n]")


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
    """Turns chunks into complete lines, per (rank, stream), each at most ``width``
    characters plus a mark saying how many more the rank's log has (``where``)."""

    def __init__(
        self, width: int = TEXT_WIDTH, where: Callable[[int], str] = lambda _rank: "the log"
    ) -> None:
        self.width = width
        self.where = where
        self._partial: dict[tuple[int, str], str] = {}
        # Of the unfinished line: characters past the width before its last \r
        # (settled), and in what is being written since (only counted, not kept).
        self._over: dict[tuple[int, str], tuple[int, int]] = {}

    def feed(self, rank: int, stream: str, text: str) -> list[str]:
        """Complete lines (without their newline) now available for this stream."""
        key = (rank, stream)
        settled = writing = 0
        if self._over and key in self._over:
            settled, writing = self._over.pop(key)
            if writing:
                # What is being written is already past the width: what continues it is only
                # counted, so a line without end costs each chunk its own length.
                found = _CONTROL.search(text)
                stop = found.start() if found else len(text)
                writing += stop
                text = text[stop:]
                if text:  # a \r or \n ended the part being written
                    settled, writing = max(settled, writing), 0
        buf = self._partial.get(key, "") + text
        *lines, rest = buf.split("\n")
        if len(buf) <= self.width and not settled:  # the common case: nothing to cut
            done = [apply_carriage_returns(line) for line in lines]
        else:
            done = [
                self._finish(rank, apply_carriage_returns(line), settled if i == 0 else 0)
                for i, line in enumerate(lines)
            ]
            if lines:
                settled = 0
        cut = rest.rfind("\r")
        if cut > 0:
            # A bar redrawn for an hour without a newline must not grow without
            # bound: settle what is before the last \r (the cursor is then at 0).
            head = apply_carriage_returns(rest[:cut])
            rest, cut = head + rest[cut:], len(head)
        if len(rest) > self.width or settled or writing:
            self._keep(key, rest, cut, settled, writing)
        else:
            self._partial[key] = rest
        return done

    def _keep(self, key: tuple[int, str], rest: str, cut: int, settled: int, writing: int) -> None:
        """Hold the unfinished line ``rest`` (its last ``\\r`` at ``cut``, -1: none) cut
        to the width, and what was cut from it (see ``_over``)."""
        width = self.width
        head, part = (rest[:cut], rest[cut:]) if cut >= 0 else ("", rest)
        if len(head) > width:
            settled = max(settled, len(head) - width)
            head = _cut(head, width)
        limit = width + 1 if cut >= 0 else width  # the part's own \r is not a character
        if len(part) > limit:
            writing = len(part) - limit
            part = _cut(part, limit)
        self._partial[key] = head + part
        if settled or writing:
            self._over[key] = (settled, writing)

    def _finish(self, rank: int, line: str, over: int) -> str:
        """``line`` cut to the width, with its mark if anything was cut."""
        over = max(over, len(line) - self.width)
        if over <= 0:
            return line
        return f"{_cut(line, self.width)} … {over:,} more characters in {self.where(rank)}"

    def has_progress(self) -> bool:
        """True if an unfinished line is being redrawn (holds a ``\\r``): a progress bar."""
        return any("\r" in rest for rest in self._partial.values())

    def progress(self) -> list[tuple[int, str, str]]:
        """The unfinished lines being redrawn, as (rank, stream, what a terminal shows)."""
        return [
            (rank, stream, self._shown(rank, stream).rstrip())
            for (rank, stream), rest in sorted(self._partial.items())
            if "\r" in rest
        ]

    def drain(self) -> list[tuple[int, str, str]]:
        """Every unfinished line, as (rank, stream, line); the buffers are emptied."""
        out = [
            (rank, stream, shown)
            for rank, stream in sorted(self._partial)
            if (shown := self._shown(rank, stream))
        ]
        self._partial.clear()
        self._over.clear()
        return out

    def _shown(self, rank: int, stream: str) -> str:
        """The unfinished line as a terminal shows it, cut and marked."""
        key = (rank, stream)
        over = max(self._over.get(key, (0, 0)))
        return self._finish(rank, apply_carriage_returns(self._partial[key]), over)


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
        width: int = TEXT_WIDTH,
    ) -> None:
        self._out = out
        self._err = err
        self._ranks = ranks  # None: every rank
        self._log_dir: Path | None = None
        self._lines = LineAssembler(width, self._where)
        self._clock = clock
        self._metric_interval = metric_interval
        self._metric_limiters: dict[int, RateLimiter] = {}
        self._pending_metrics: dict[int, MetricRow] = {}
        self._progress_limiter = RateLimiter(progress_interval, clock)
        self._progress_limiter.fire()  # the first snapshot after one interval
        self._progress_shown: dict[tuple[int, str], str] = {}

    def _stream(self, stream: str) -> TextIO:
        if stream == "stderr":
            return self._err or sys.stderr
        return self._out or sys.stdout

    def output(self, rank: int, stream: str, text: str) -> None:
        """Write the complete lines in ``text``; hold the unfinished one."""
        if self._ranks is not None and rank not in self._ranks:
            return
        lines = self._lines.feed(rank, stream, text)
        if lines:
            self._progress_shown.pop((rank, stream), None)
            self._write(stream, "".join(f"[rank {rank}] {line}\n" for line in lines))

    def attach(self, log_dir: Path, world_size: int) -> None:
        """Note where the logs are (a cut line names its log); lines are written as they come."""
        self._log_dir = log_dir

    def _where(self, rank: int) -> str:
        return str(rank_log(self._log_dir, rank)) if self._log_dir is not None else "the log"

    def notice(self, text: str) -> None:
        """A one-line message from nbddp itself."""
        self._write("stderr", f"nbddp: {text}\n")

    def state(self, rank: int, state: str) -> None:
        """Rank state changes are not shown as text (errors are raised instead)."""

    def metric(self, rank: int, row: MetricRow) -> None:
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


def _cut(text: str, width: int) -> str:
    """``text``'s first ``width`` characters, without an escape sequence cut in two."""
    if len(text) <= width:
        return text
    text = text[:width]
    return _TRAILING_ESCAPE.sub("", text) if "\x1b" in text else text
