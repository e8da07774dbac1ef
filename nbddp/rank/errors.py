"""A rank's exception and its stacks, in the form that crosses to the notebook.

``error_info(exc)`` is its ``protocol.ErrorInfo``: type name, message, time, the exception packed
when it rebuilds as its own type, and two tracebacks: the one shown, without nbddp's frames (in
every chained exception), and the full one for the rank's log.

``format_stacks(rank)``: every Python thread's stack, main first, without the frames that only
launched the user's code; threads running only nbddp's are named at the end. It runs on the link
thread, so it answers while the main thread waits in C with the GIL released; a thread holding the
GIL blocks it (the notebook then falls back to faulthandler's signal).
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from types import FrameType

from nbddp.wire import shm, sources, values
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
        # Rebuilt here, on private mappings: only ship what the notebook will be able to rebuild.
        rebuilt = shm.loads(packed.data, packed.fds.fds)
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


_LAUNCH_FILES = ("runpy.py", "<frozen runpy>", "threading.py", "<string>")


def _launches(summary: traceback.FrameSummary) -> bool:
    """Whether a frame is one of those that only started the user's code."""
    name = summary.filename
    return name.startswith(NBDDP_DIR) or name.endswith(_LAUNCH_FILES)


def user_frames(frame: FrameType) -> tuple[list[traceback.FrameSummary], bool]:
    """A thread's stack, outermost first, without the frames that launched it, and whether
    any frame is the user's (if none, the whole stack: nothing is hidden)."""
    stack = traceback.extract_stack(frame)
    first = next((i for i, s in enumerate(stack) if not _launches(s)), None)
    return (list(stack), False) if first is None else (list(stack)[first:], True)


def format_stacks(rank: int) -> str:
    """Every thread's stack; ends with a newline."""
    frames = sys._current_frames()  # the documented way to see other threads' frames
    names = {t.ident: t.name for t in threading.enumerate()}
    main = threading.main_thread().ident
    lines = [f"nbddp: rank {rank} (pid {os.getpid()}) stacks, most recent call last:\n"]
    own: list[str] = []
    # The main thread first: that is where the user's function runs.
    for ident in sorted(frames, key=lambda i: i != main):
        name = names.get(ident, f"thread {ident:#x}")
        stack, users = user_frames(frames[ident])
        if not users and name.startswith("nbddp-"):
            own.append(name)
            continue
        lines.append(f"Thread {name!r}:\n")
        lines.extend(sources.named(frame) for frame in traceback.format_list(stack))
    if own:
        lines.append(f"(nbddp's own threads, not shown: {', '.join(sorted(own))})\n")
    return "".join(lines)
