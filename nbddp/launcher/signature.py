"""Checking a launch's call against the function's signature, before anything starts.

``check_call(fn, args, kwargs)`` raises a one-line ``CallError`` (a
``PayloadError``, so a ``TypeError``) when ``fn(*args, **kwargs)`` cannot bind,
offering a launch option a keyword was likely meant for. ``WithRank`` is
checked as ``fn(rank, *args)``; where no signature can be read, nothing is.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping

from nbddp.launcher.spelling import CallError, Say, close_options
from nbddp.rank.context import WithRank
from nbddp.wire.payload import Args, Fn

_RANK = 0  # stands for the rank spawn() puts first; only its position matters


def check_call(fn: Fn, args: Args, kwargs: Mapping[str, object]) -> None:
    """Raise ``CallError`` if ``fn(*args, **kwargs)`` cannot bind to ``fn``'s signature."""
    target, how = fn, ""
    if isinstance(fn, WithRank):
        target, args, how = fn.fn, (_RANK, *args), " (spawn calls it as fn(rank, *args))"
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return  # no signature to read: the ranks will say
    try:
        signature.bind(*args, **kwargs)
    except TypeError as exc:
        reason = str(exc)
        if reason.startswith(("too many", "multiple values")):
            reason = f"got {reason}"  # as Python says it: "f() got multiple values for ..."
        message = f"{_name(target)}() {reason}{how}"
        hint = _hint(str(exc), kwargs)
        raise CallError(lambda s: f"{message}; {hint(s)}" if hint else message) from None


def _name(fn: Fn) -> str:
    while isinstance(fn, functools.partial):
        fn = fn.func
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    return name if isinstance(name, str) else type(fn).__name__


def _hint(error: str, kwargs: Mapping[str, object]) -> Say | None:
    """``did you mean the launch option procs=2?`` for an unexpected keyword near one."""
    if "unexpected keyword" not in error:
        return None
    for key, value in kwargs.items():
        options = close_options(key) if repr(key) in error else ()
        if options:
            return lambda s: f"did you mean {s.suggest(options, value)}?"
    return None
