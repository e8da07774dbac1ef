"""A terminal-like screen for one rank's output, keeping only a bounded tail.

``Screen(tail).feed(text, stream)`` applies ``\n``, ``\r``, ``\b`` and the ANSI cursor moves
tqdm uses (``ESC[nA/B/C/D/G``, ``ESC[K``) as a terminal would and drops every other escape, so
``lines()`` is plain text; only the last ``tail`` lines are kept (``dropped`` counts the rest). It
never raises and stays linear: lines are cut at ``width``, counts and unended escapes are bounded.
stdout and stderr each keep their unfinished line, so a tqdm bar on stderr redraws in place while
the loop prints on stdout. Non-goals: colours, wide characters, scrolling regions.
"""

from __future__ import annotations

import re

WIDTH = 1000
"""Characters kept per line: a wide terminal's width several times over."""
MAX_ESCAPE = 4096
"""Longest escape sequence held while waiting for its end (an OSC link fits)."""
_MAX_COUNT = 10**9  # a cursor count with more digits than this is clamped to it
# One control token: newline, carriage return, backspace, a CSI sequence (ESC [ params intermediates
# final), an OSC string (ESC ] ... BEL/ST), or a two-character escape.
_TOKEN = re.compile(
    r"(\n|\r|\x08|\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_])"
)
# An escape sequence cut off by the end of a chunk.
_INCOMPLETE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*|\][^\x07\x1b]*)?$")
_SLOW = re.compile(r"[\r\x08\x1b]")
_CSI_NOT_SGR = re.compile(r"\x1b\[[0-?]*[ -/]*[@-ln-~]")


def strip_cursor_codes(line: str) -> str:
    """``line`` without ANSI cursor movement and erase sequences (colours are kept): on a
    plain terminal a rank's ``ESC[A`` would move over other ranks' lines."""
    return _CSI_NOT_SGR.sub("", line) if "\x1b" in line else line


class Screen:
    """One rank's recent output as a terminal would show it."""

    def __init__(self, tail: int = 40, width: int = WIDTH, where: str = "the log") -> None:
        if tail < 1:
            raise ValueError(f"tail must be at least 1, not {tail}")
        self.tail = tail
        self.width = width
        self.where = where
        """Where a cut line's rest is, as its mark says (the rank's log file)."""
        self.dropped = 0  # lines no longer kept at all
        self._lines: list[str] = [""]
        self._over: dict[int, int] = {}  # index in _lines -> characters past the width
        self._row = self._col = 0
        self._stream = ""
        self._pending = ""  # an escape sequence split by the chunk boundary
        self._unfinished: dict[str, tuple[int, int]] = {}  # stream -> (row, col) it left
        self._returned = False  # the cursor is on a stream's earlier line, above the bottom

    def feed(self, text: str, stream: str = "stdout") -> None:
        """Apply ``text`` written to ``stream`` at the cursor."""
        if stream != self._stream:
            self._switch(stream)
        if self._pending:
            text, self._pending = self._pending + text, ""
        if "\x1b" in text:
            cut = _INCOMPLETE.search(text)
            if cut is not None:
                text, pending = text[: cut.start()], text[cut.start() :]
                # Held only while it may still be an escape; past that it is noise.
                self._pending = pending if len(pending) <= MAX_ESCAPE else ""
        if _SLOW.search(text) is None:
            self._feed_plain(text)
        else:
            self._feed_controls(text)
        self._trim()

    def lines(self) -> list[str]:
        """The last ``tail`` lines, oldest first, trailing spaces removed; a cut line
        ends with ``… N more characters in <where>``."""
        kept = self._kept()
        first = max(0, len(kept) - self.tail)
        shown = [line.rstrip(" ") for line in kept[first:]]
        for index, over in self._over.items():
            if first <= index < len(kept):
                shown[index - first] += f" … {over:,} more characters in {self.where}"
        return shown

    @property
    def total(self) -> int:
        """Every line so far, shown or not (empty lines under the cursor not counted)."""
        return self.dropped + len(self._kept())

    @property
    def hidden(self) -> int:
        """Lines older than the shown tail: they are only in the log."""
        return max(0, self.total - self.tail)

    # -- internals ---------------------------------------------------------

    def _kept(self) -> list[str]:
        # Empty lines at or below the cursor are where output will go, not output.
        end = len(self._lines)
        while end > self._row and self._lines[end - 1] == "":
            end -= 1
        return self._lines[:end]

    def _switch(self, stream: str) -> None:
        """Leave the current stream's unfinished line; go back to ``stream``'s own."""
        if self._stream and self._col > 0:
            self._unfinished[self._stream] = (self._row, self._col)
            self._newline()
        self._stream = stream
        saved = self._unfinished.pop(stream, None)
        # Only to a line still shown: one that scrolled out of the tail is gone for good.
        if saved is not None and len(self._kept()) - self.tail <= saved[0] < len(self._lines) - 1:
            self._row, self._col = saved
            self._returned = True

    def _feed_plain(self, text: str) -> None:
        """Text with newlines but no other controls: the hot path for ``print``."""
        parts = text.split("\n")
        self._write(parts[0])
        if len(parts) == 1:
            return
        rest = parts[1:]
        if self._row == len(self._lines) - 1 and not self._returned:
            # At the bottom, as usual: append in bulk, skipping lines that
            # would scroll straight out of the tail.
            if len(rest) > self.tail + 1:
                self.dropped += len(rest) - (self.tail + 1)
                rest = rest[-(self.tail + 1) :]
            start = len(self._lines)
            self._lines.extend(rest)
            self._row = len(self._lines) - 1
            self._col = len(rest[-1])
            if len(text) > self.width:  # only then can a line be too long
                for index in range(start, len(self._lines)):
                    if len(line := self._lines[index]) > self.width:
                        self._over[index] = len(line) - self.width
                        self._lines[index] = line[: self.width]
            return
        for part in rest:
            self._newline()
            self._write(part)

    def _feed_controls(self, text: str) -> None:
        for token in _TOKEN.split(text):
            if not token:
                continue
            if token == "\n":
                self._newline()
            elif token == "\r":
                self._col = 0
            elif token == "\x08":
                self._col = max(0, self._col - 1)
            elif token[0] == "\x1b":
                self._escape(token)
            else:
                self._write(token)

    def _escape(self, seq: str) -> None:
        if len(seq) < 3 or seq[1] != "[":
            return  # OSC or two-character escape: nothing to show
        final, params = seq[-1], seq[2:-1]
        n = _count(params)
        if final == "A":
            self._row = max(0, self._row - max(n, 1))
        elif final == "B":
            self._row = min(len(self._lines) - 1, self._row + max(n, 1))
        elif final == "C":
            # A terminal's cursor stops at the last column.
            self._col = max(self._col, min(self._col + max(n, 1), self.width - 1))
        elif final == "D":
            self._col = max(0, self._col - max(n, 1))
        elif final == "G":
            self._col = min(max(n, 1), self.width) - 1
        elif final == "K":
            self._erase(n)
        # Colours (m) and everything else: dropped.

    def _erase(self, n: int) -> None:
        """``ESC[nK``: erase to the end (0), to the start (1) or the whole line (2)."""
        row, col = self._row, self._col
        line = self._lines[row]
        if n == 0:
            self._lines[row] = line[:col]
            if col < self.width:
                self._over.pop(row, None)
        elif n == 1:
            self._lines[row] = " " * min(col, len(line)) + line[col:]
        elif n == 2:
            self._lines[row] = ""
            self._over.pop(row, None)

    def _write(self, text: str) -> None:
        if not text:
            return
        col = self._col
        end = self._col = col + len(text)
        if end > self.width:
            # Past the width only the line's length is kept, for its mark.
            row = self._row
            self._over[row] = max(self._over.get(row, 0), end - self.width)
            text = text[: max(0, self.width - col)]
            if not text:
                return
        line = self._lines[self._row]
        if col > len(line):
            line += " " * (col - len(line))
        self._lines[self._row] = line[:col] + text + line[col + len(text) :]

    def _newline(self) -> None:
        if self._returned:
            # The line a stream came back to is done: go on below everything.
            self._returned = False
            self._row = len(self._lines) - 1
            if self._lines[self._row]:
                self._row += 1
        else:
            self._row += 1
        self._col = 0
        if self._row == len(self._lines):
            self._lines.append("")

    def _trim(self) -> None:
        # Keep the tail plus the cursor line; slack of one tail so that
        # trimming (a list copy) happens once per ``tail`` lines, not per line.
        excess = len(self._lines) - 2 * self.tail - 1
        if excess <= 0:
            return
        excess += self.tail
        del self._lines[:excess]
        self.dropped += excess
        self._row = max(0, self._row - excess)
        if self._over:
            self._over = {i - excess: n for i, n in self._over.items() if i >= excess}
        self._unfinished = {
            stream: (row - excess, col)
            for stream, (row, col) in self._unfinished.items()
            if row >= excess
        }


def _count(params: str) -> int:
    """A CSI sequence's count: 0 when absent or not a plain number; a number of any
    length is read without parsing more digits than a count can need."""
    if not params.isdigit():
        return 0
    digits = params.lstrip("0")
    return int(digits or "0") if len(digits) <= 9 else _MAX_COUNT
