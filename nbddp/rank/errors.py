"""A rank's exception, in the form that crosses to the notebook.

Contract: ``error_info(exc)`` describes what the user's code raised as a
``protocol.ErrorInfo``: its type name, message and traceback text (without
nbddp's own outer frames: the user's code comes first), the time it reached
nbddp, and the exception itself packed as a return value is when it
rebuilds as its own type. ``unsendable(what, value, exc)`` is the error for
a value that cannot be pickled back. ``is_ours(filename)``: whether code
lies in nbddp's package. The notebook's own exceptions are ``nbddp.errors``.
"""

from __future__ import annotations

import os
import time
import traceback

from nbddp.wire import values
from nbddp.wire.descriptors import Packed
from nbddp.wire.protocol import ErrorInfo

NBDDP_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
"""nbddp's root: the worker, the cell program and spawn()'s wrapper all lie under it."""


def is_ours(filename: str) -> bool:
    """Whether ``filename`` is one of nbddp's own files."""
    return os.path.abspath(filename).startswith(NBDDP_DIR)


def error_info(exc: BaseException) -> ErrorInfo:
    """Describe ``exc`` so that the notebook can re-raise it (see module contract)."""
    raised_at = time.time()
    tb = exc.__traceback__
    while tb is not None and is_ours(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    name = f"{type(exc).__module__}.{type(exc).__qualname__}"
    try:
        message = str(exc)
    except Exception as failure:
        # Such an exception cannot be shown in the notebook either: it travels as text.
        return ErrorInfo(
            name, f"<its str() raised {type(failure).__name__}>", text, None, raised_at
        )
    return ErrorInfo(name, message, text, _rebuildable(exc), raised_at)


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
