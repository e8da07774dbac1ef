"""Text display: rank-prefixed lines, for terminals, scripts and plain kernels.

Contract: ``TextDisplay.output(rank, stream, text)`` accepts chunks as they
arrive and writes only whole lines, each prefixed ``[rank N] `` and written
with one ``write`` call, so ranks never interleave mid-line. A carriage
return rewinds the current line as a terminal would: of ``"a\\rb\\n"`` only
``b`` is printed, so a tqdm bar appears as its final state, not as a line
per redraw. ``close()`` writes what is left of unfinished lines.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO


def apply_carriage_returns(line: str) -> str:
    """What a terminal shows for ``line`` (no newline inside): the text after the last
    ``\\r`` overwrites the start of what came before it."""
    if "\r" not in line:
        return line
    shown = ""
    for segment in line.split("\r"):
        shown = segment + shown[len(segment) :]
    return shown


class LineAssembler:
    """Turns chunks into complete lines, per (rank, stream)."""

    def __init__(self) -> None:
        self._partial: dict[tuple[int, str], str] = {}

    def feed(self, rank: int, stream: str, text: str) -> list[str]:
        """Complete lines (without their newline) now available for this stream."""
        key = (rank, stream)
        buf = self._partial.get(key, "") + text
        *lines, rest = buf.split("\n")
        self._partial[key] = rest
        return [apply_carriage_returns(line) for line in lines]

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
    ) -> None:
        self._out = out
        self._err = err
        self._ranks = ranks  # None: every rank
        self._lines = LineAssembler()

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
            self._write(stream, "".join(f"[rank {rank}] {line}\n" for line in lines))

    def notice(self, text: str) -> None:
        """A one-line message from nbddp itself."""
        self._write("stderr", f"nbddp: {text}\n")

    def state(self, rank: int, state: str) -> None:
        """Rank state changes are not shown as text (errors are raised instead)."""

    def metric(self, rank: int, row: dict[str, Any]) -> None:
        """Metrics are kept in the result; the text display does not print them."""

    def close(self) -> None:
        """Write unfinished lines; call once the run's output is complete."""
        for rank, stream, line in self._lines.drain():
            self._write(stream, f"[rank {rank}] {line}\n")
        for stream in ("stdout", "stderr"):
            self._stream(stream).flush()

    def _write(self, stream: str, text: str) -> None:
        target = self._stream(stream)
        target.write(text)
        target.flush()
