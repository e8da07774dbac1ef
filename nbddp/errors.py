"""The exceptions nbddp raises in the notebook.

Configuration and payload problems raise before any process starts (``ConfigError``,
``PayloadError``); a running job's, after every rank has stopped and its output is collected
(``RankError`` and subclasses, ``LaunchTimeout``). A rank's own exception is re-raised as its own
type whenever it unpickles here; these classes are the fallback. ``show_as`` makes an error show
in IPython as given lines, not its traceback (``ShownLines``: the same for any exception).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable

_LOG_LINE = re.compile(r"(^full output in | output is in )/\S*/(rank(\d+)\.log)$")


class ShownLines:
    """What IPython shows for an exception (its ``_render_traceback_``): ``lines``, then the
    notes added to it since (what became of a session). Holds the notes, not the exception."""

    def __init__(self, exc: BaseException, lines: Iterable[str], once: bool = False) -> None:
        self.lines = tuple(lines)
        self.once, self.spent = once, False
        notes = getattr(exc, "__notes__", None)
        if not isinstance(notes, list):
            notes = []
            exc.__notes__ = notes  # what ``add_note`` appends to from now on
        self.notes = notes
        self.known = len(notes)

    def __call__(self) -> list[str]:
        self.spent = self.once
        lines = [*self.lines, *(str(note) for note in self.notes[self.known :])]
        if not os.environ.get("JPY_SESSION_NAME"):
            return lines
        # A kernel of a Jupyter server: JupyterLab links a path in an error to its debugger
        # ("Start debugger?") unless it is under its root; the rank's block shows the path.
        named = r"\1\2, its path under rank \3's block above"
        return [_LOG_LINE.sub(named, line) for line in lines]


class NbddpError(Exception):
    """Base class of every error nbddp itself raises."""

    _shown: ShownLines | None = None

    def show_as(self, lines: Iterable[str], once: bool = False) -> None:
        """Have IPython show ``lines`` for this error instead of its local traceback
        (then the notes added to it afterwards); with ``once``, the first time only."""
        self._shown = ShownLines(self, lines, once)

    @property
    def _render_traceback_(self) -> Callable[[], list[str]]:
        """IPython's hook, present only after ``show_as`` (a property: IPython and the magics
        test for it with ``hasattr``)."""
        if self._shown is None or self._shown.spent:
            raise AttributeError("_render_traceback_")
        return self._shown


class ConfigError(NbddpError, ValueError):
    """A launch option is invalid. Raised before any process starts."""


class PayloadError(NbddpError, TypeError):
    """The function or its arguments cannot be sent to the workers."""


class CellError(NbddpError, ValueError):
    """A ``%%ddp`` cell cannot run as written (empty, or a value that cannot come back)."""


class SessionError(NbddpError, RuntimeError):
    """A session cannot take the call: none runs, it has ended, or another of its
    cells still runs. Says what to do."""


class RankError(NbddpError, RuntimeError):
    """A rank failed. ``rank`` is the failing rank, ``log_path`` its full log."""

    def __init__(self, message: str, *, rank: int, log_path: str | None = None) -> None:
        super().__init__(message)
        self.rank = rank
        self.log_path = log_path


class RemoteError(RankError):
    """A rank raised an exception that cannot be rebuilt here as itself: ``remote_type`` is
    its type's qualified name, ``remote_traceback`` the traceback as the rank printed it."""

    def __init__(
        self,
        message: str,
        *,
        rank: int,
        remote_type: str,
        remote_traceback: str,
        log_path: str | None = None,
    ) -> None:
        super().__init__(message, rank=rank, log_path=log_path)
        self.remote_type = remote_type
        self.remote_traceback = remote_traceback


WorkerError = RemoteError
"""``RemoteError``'s earlier name, kept so that code catching it goes on working."""


class RankExitedError(RankError):
    """A rank ended without returning: a non-zero exit code or a signal."""

    def __init__(
        self, message: str, *, rank: int, exit_code: int | None, log_path: str | None = None
    ) -> None:
        super().__init__(message, rank=rank, log_path=log_path)
        self.exit_code = exit_code


class ResultError(RankError):
    """A rank returned a value that cannot be rebuilt in the notebook: ``type_name`` is its
    type in the rank, the error raised while rebuilding it the ``__cause__``."""

    def __init__(
        self, message: str, *, rank: int, type_name: str, log_path: str | None = None
    ) -> None:
        super().__init__(message, rank=rank, log_path=log_path)
        self.type_name = type_name


class LaunchTimeout(NbddpError, TimeoutError):
    """The run exceeded its ``timeout`` and was stopped."""


class RemoteTraceback(Exception):
    """A rank's traceback text, as the ``__cause__`` of the re-raised exception: Python prints
    a cause first, so the rank's own traceback shows before the local line that re-raised it."""

    def __init__(self, tb: str) -> None:
        super().__init__(tb)  # its only argument: ``str()`` gives the text
        self.tb = tb
