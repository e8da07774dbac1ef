"""A display that never raises, so that no display error can break or hang a run.

Contract: ``Guarded(display, ranks)`` implements ``launcher.display.Display``
by calling ``display``. When that raises (any ``Exception``; a
``KeyboardInterrupt`` goes through, and the run stops its ranks), the error
is reported once on stderr and a ``TextDisplay`` of ``ranks`` takes over,
starting with the call that failed, so nothing is skipped; if the text
display fails too, the rest of the run is shown by nothing (every rank's
log keeps all its output either way). ``inner`` is the display in use now,
None once both have failed.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from nbddp.display.text import TextDisplay
from nbddp.launcher.display import Display
from nbddp.wire.protocol import MetricRow

MAX_ERROR_TEXT = 200  # characters of an error's message in its one-line report


class Guarded:
    """A display that never raises (see module contract)."""

    def __init__(self, display: Display, ranks: set[int] | None) -> None:
        self.inner: Display | None = display
        self._ranks = ranks
        self._log_dir = Path()
        self._world_size = 0
        self._fell_back = False

    def attach(self, log_dir: Path, world_size: int) -> None:
        """As the display's; remembered for the text display that may take over."""
        self._log_dir, self._world_size = log_dir, world_size
        self._call("attach", log_dir, world_size)

    def output(self, rank: int, stream: str, text: str) -> None:
        """As the display's."""
        self._call("output", rank, stream, text)

    def notice(self, text: str) -> None:
        """As the display's."""
        self._call("notice", text)

    def state(self, rank: int, state: str) -> None:
        """As the display's."""
        self._call("state", rank, state)

    def metric(self, rank: int, row: MetricRow) -> None:
        """As the display's."""
        self._call("metric", rank, row)

    def refresh(self) -> float | None:
        """As the display's; None once there is no display left."""
        delay: float | None = self._call("refresh")
        return delay

    def close(self) -> None:
        """As the display's."""
        self._call("close")

    def _call(self, name: str, *args: Any) -> Any:
        while self.inner is not None:
            try:
                return getattr(self.inner, name)(*args)
            except Exception as exc:
                self._failed(exc)  # the call goes on to what replaced it, attached already
                if name == "attach":
                    return None
        return None

    def _failed(self, exc: Exception) -> None:
        self.inner = None
        where = self._log_dir
        if self._fell_back:
            report(
                f"the text display failed too ({describe(exc)}); the rest of this run "
                f"is only in its logs, in {where}"
            )
            return
        self._fell_back = True
        text = TextDisplay(ranks=self._ranks)
        try:
            text.attach(where, self._world_size)
            text.notice(
                f"the display failed ({describe(exc)}); showing the rest of this run as "
                f"text (each rank's log keeps all its output, in {where})"
            )
        except Exception as text_exc:
            report(
                f"the display failed ({describe(exc)}), and so did the text display "
                f"({describe(text_exc)}); the run's output is only in {where}"
            )
            return
        self.inner = text


def describe(exc: BaseException) -> str:
    """``Type: first line of the message`` (cut short), or the type alone."""
    name = type(exc).__name__
    try:
        message = str(exc)
    except Exception:  # its __str__ is broken too: the type still says something
        message = ""
    message = message.strip().split("\n", 1)[0]
    if len(message) > MAX_ERROR_TEXT:
        message = message[: MAX_ERROR_TEXT - 1] + "…"
    return f"{name}: {message}" if message else name


def report(text: str) -> None:
    """A one-line notice for the user on stderr, wherever it still works."""
    for stream in (sys.stderr, sys.__stderr__):
        try:
            print(f"nbddp: {text}", file=stream, flush=True)
        except Exception:
            continue
        return
