"""Notebook source lines that travel with the code written in them, and cells' traceback names.

``notebook_sources(filenames)`` (in the notebook): a ``Source`` for each file only in
``linecache`` (an IPython or ``%%ddp`` cell), with the name IPython's tracebacks give it
(``Cell In[6]``). ``register(sources)`` (anywhere) puts them in ``linecache``; ``named(text)``
rewrites formatted frame heads of those files as IPython writes them. IPython is not imported.
"""

from __future__ import annotations

import linecache
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Source:
    """One notebook file's lines, as ``linecache`` holds them, and its shown name."""

    filename: str
    lines: tuple[str, ...]
    shown: str | None = None
    """How frames of this file are named (``Cell In[6]``); None: by the filename."""


_SHOWN: dict[str, str] = {}
"""filename -> the name its frames show, for the sources registered here."""

_FRAME_HEAD = re.compile(r'^([ |]*)File "([^"\n]+)", line ', re.MULTILINE)
"""The head of a frame as ``traceback`` formats it (``|`` prefixes: exception groups)."""


def notebook_sources(filenames: Iterable[str]) -> tuple[Source, ...]:
    """The sources of those ``filenames`` that only ``linecache`` knows (see contract)."""
    found = []
    for filename in dict.fromkeys(filenames):  # once each, in order
        entry = linecache.cache.get(filename)
        # (size, mtime, lines, name) with mtime None: registered source, no file
        # behind it (a module's entry has its file's mtime; the rank reads the file).
        if isinstance(entry, tuple) and len(entry) == 4 and entry[1] is None:
            found.append(Source(filename, tuple(entry[2]), cell_name(filename)))
    return tuple(found)


def cell_name(filename: str, shell: object = None) -> str | None:
    """``Cell In[6]``: what IPython's tracebacks call ``filename``, one of its cells;
    None when no IPython shell runs here or the file is not one of its cells.
    ``shell``: the shell to ask (default: the running one)."""
    if shell is None:
        ipython = sys.modules.get("IPython")
        shell = ipython.get_ipython() if ipython is not None else None
    compiler = getattr(shell, "compile", None)
    if compiler is None or not hasattr(compiler, "format_code_name"):
        return None
    named = compiler.format_code_name(filename)
    return f"{named[0]} {named[1]}" if named else None


def register(sources: Iterable[Source]) -> None:
    """Make each source's lines ``linecache``'s for its file, and remember its name."""
    for source in sources:
        size = sum(len(line) for line in source.lines)
        # mtime None: ``linecache.checkcache`` leaves the entry alone.
        linecache.cache[source.filename] = (size, None, list(source.lines), source.filename)
        if source.shown is not None:
            _SHOWN[source.filename] = source.shown


def named(text: str) -> str:
    """``text`` (formatted traceback or stack lines) with the frames of registered
    named files headed as IPython heads them (see contract); other text unchanged."""
    if not _SHOWN:
        return text

    def head(match: re.Match[str]) -> str:
        shown = _SHOWN.get(match.group(2))
        return match.group(0) if shown is None else f"{match.group(1)}{shown}, line "

    return _FRAME_HEAD.sub(head, text)
