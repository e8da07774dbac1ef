"""A display that never raises, so that no display error can break or hang a run.

``Guarded(display, ranks)`` calls ``display``; when it raises an ``Exception`` (an interrupt goes
through), the error is reported once and the display is replaced from the failed call on: by a
``TextDisplay`` on stdout, or by nothing once ``pin()`` said a background thread draws. A display
that can ``retire`` (the kernel's) keeps drawing true headers with a note. ``inner``: the display
in use, None once none is left.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import TextIO, cast

from nbddp.display.text import TextDisplay
from nbddp.launcher.events import RankEnd
from nbddp.launcher.pump import Display
from nbddp.wire.protocol import MetricRow

MAX_ERROR_TEXT = 200  # characters of an error's message in its one-line report

log = logging.getLogger(__name__)


class Guarded:
    def __init__(self, display: Display, ranks: set[int] | None) -> None:
        self.inner: Display | None = display
        self._ranks = ranks
        self._log_dir = Path()
        self._world_size = 0
        self._fell_back = False
        self._pinned = False
        self._retired: Display | None = None  # the failed display, drawing its headers only

    def attach(self, log_dir: Path, world_size: int) -> None:
        """As the display's; remembered for the text display that may take over."""
        self._log_dir, self._world_size = log_dir, world_size
        self._call("attach", log_dir, world_size)

    def output(self, rank: int, stream: str, text: str) -> None:
        self._call("output", rank, stream, text)

    def notice(self, text: str) -> None:
        self._call("notice", text)

    def state(self, rank: int, state: str) -> None:
        """As the display's (and the retired display's headers')."""
        self._call("state", rank, state)
        self._retired_call("state", rank, state)

    def metric(self, rank: int, row: MetricRow) -> None:
        self._call("metric", rank, row)

    def refresh(self) -> float | None:
        """As the display's; None once there is no display left."""
        return cast("float | None", self._call("refresh"))

    def close(self) -> None:
        """As the display's (and the retired display's final headers)."""
        self._call("close")
        self._retired_call("close")

    # -- optional calls --------------------------------------------------------

    def ended(self, end: RankEnd) -> None:
        """How a rank ended: the display's ``ended``, else its ``state``."""
        if hasattr(self.inner, "ended"):
            self._call("ended", end)
        else:
            self._call("state", end.rank, end.state)
        self._retired_call("ended", end)

    def starting(self, world_size: int) -> None:
        """The display's ``starting``, if it has one."""
        if hasattr(self.inner, "starting"):
            self._call("starting", world_size)

    def not_started(self) -> None:
        """The display's ``not_started``, if it has one."""
        if hasattr(self.inner, "not_started"):
            self._call("not_started")

    def pin(self) -> None:
        """The display's ``pin``, if it has one; from now on no text takes over."""
        self._pinned = True
        if hasattr(self.inner, "pin"):
            self._call("pin")

    # -- internals ---------------------------------------------------------------

    def _call(self, name: str, *args: object) -> object:
        while self.inner is not None:
            try:
                return getattr(self.inner, name)(*args)
            except Exception as exc:
                self._failed(exc)  # the call goes on to what replaced it, attached already
                if name in ("attach", "starting", "not_started", "pin", "ended"):
                    return None
        return None

    def _retired_call(self, name: str, *args: object) -> None:
        retired = self._retired
        if retired is None:
            return
        try:
            getattr(retired, name)(*args)
        except Exception:
            log.warning("nbddp: the failed display could not draw its headers", exc_info=True)
            self._retired = None

    def _failed(self, exc: Exception) -> None:
        failed, self.inner = self.inner, None
        where = self._log_dir
        if self._fell_back:
            report(
                f"the text display failed too ({describe(exc)}); the rest of this run "
                f"is only in its logs, in {where}"
            )
            return
        self._fell_back = True
        if hasattr(failed, "retire"):  # it keeps drawing true headers, with a note
            self._retired = failed
            shown = "below as text" if not self._pinned else "not shown"
            self._retired_call(
                "retire", f"the display failed ({describe(exc)}); output from here on is {shown}"
            )
        retired = self._retired is not None
        if self._pinned:
            # Not on sys.stderr: from this thread, that lands in whatever cell runs now.
            message = f"the display failed ({describe(exc)}); this run's output is in {where}"
            log.warning("nbddp: %s", message, exc_info=exc)
            if not retired:
                report(message, streams=(sys.__stderr__,))
            return
        text = TextDisplay(ranks=self._ranks)
        # The blocks, when they still stand, show each log's path (as HTML: a path
        # in a stream becomes a link JupyterLab may not open).
        kept = "in the blocks above" if retired else f"in {where}"
        try:
            text.attach(where, self._world_size)
            text.notice(
                f"the display failed ({describe(exc)}); showing the rest of this run as "
                f"text (each rank's log keeps all its output; its path is {kept})"
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


def report(text: str, streams: tuple[TextIO | None, ...] | None = None) -> None:
    """A one-line notice for the user on stderr, or the first of ``streams`` that works."""
    for stream in streams or (sys.stderr, sys.__stderr__):
        if stream is None:
            continue
        try:
            print(f"nbddp: {text}", file=stream, flush=True)
        except Exception:
            continue
        return
