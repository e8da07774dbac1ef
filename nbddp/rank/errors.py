"""A rank's exception, in the form that crosses to the notebook.

``error_info(exc)`` is its ``protocol.ErrorInfo``: type name, message, the time it reached nbddp,
the exception packed as a value when it rebuilds as its own type, and two tracebacks: the one
shown, without nbddp's frames (in every chained exception), and the full one for the rank's log.
``unsendable(what, value, exc)``: the error for a value that cannot be pickled back;
``is_ours(filename)``: whether code is nbddp's. The notebook's own exceptions: ``nbddp.errors``.
"""

from __future__ import annotations

import os
import time
import traceback

from nbddp.wire import sources, values
from nbddp.wire.descriptors import Packed
from nbddp.wire.protocol import ErrorInfo

NBDDP_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
"""nbddp's root: the worker, the cell program and spawn()'s wrapper all lie under it."""


def is_ours(filename: str) -> bool:
    """Whether ``filename`` is one of nbddp's own files (``<...>`` names never are)."""
    return not filename.startswith("<") and os.path.abspath(filename).startswith(NBDDP_DIR)


def error_info(exc: BaseException) -> ErrorInfo:
    """Describe ``exc`` so that the notebook can re-raise it."""
    raised_at = time.time()
    full = sources.named("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
    shown = sources.named("".join(users_traceback(exc).format()))
    name = f"{type(exc).__module__}.{type(exc).__qualname__}"
    try:
        message = str(exc)
    except Exception as failure:
        # Such an exception cannot be shown in the notebook either: it travels as text.
        message, packed = f"<its str() raised {type(failure).__name__}>", None
    else:
        packed = _rebuildable(exc)
    return ErrorInfo(name, message, shown, packed, raised_at, full if full != shown else None)


def users_traceback(exc: BaseException) -> traceback.TracebackException:
    """``exc``'s traceback without nbddp's own frames, in it and in every exception
    chained to it (cause, context, members of a group)."""
    top = traceback.TracebackException.from_exception(exc)
    pending, seen = [top], set()
    while pending:
        te = pending.pop()
        if id(te) in seen:
            continue
        seen.add(id(te))
        te.stack = traceback.StackSummary.from_list(
            [frame for frame in te.stack if not is_ours(frame.filename)]
        )
        chained = [te.__cause__, te.__context__, *(getattr(te, "exceptions", None) or ())]
        pending.extend(c for c in chained if c is not None)
    return top


def _rebuildable(exc: BaseException) -> Packed | None:
    """``exc`` packed as a return value is, when it rebuilds as its own type; else None."""
    try:
        packed = values.pack(exc)
        rebuilt = values.trial(packed)  # only ship what the notebook will be able to rebuild
    except Exception:
        return None
    return packed if type(rebuilt) is type(exc) else None


def unsendable(what: str, value: object, exc: Exception) -> TypeError:
    """The error for ``value`` (``what``: the return value, the cell's value) that
    cannot be pickled back to the notebook."""
    return TypeError(
        f"{what} ({type(value).__name__}) cannot be pickled: {exc}; "
        "return plain data (numbers, tensors, dicts) instead"
    )
