"""A rank's Python stacks, as one block of text that shows the user's code first.

``format_stacks(rank)``: every Python thread, main first, without the frames that only launched
the user's code; threads running only nbddp's code are named on one line at the end, and notebook
cells as IPython names them. Called on the link thread, so it answers while the main thread waits
in C with the GIL released; a thread holding the GIL blocks it (the notebook then falls back to
faulthandler's signal, whose dump is noisier and needs a signal the user may have claimed).
"""

from __future__ import annotations

import os
import sys
import threading
import traceback
from types import FrameType

from nbddp.rank.errors import NBDDP_DIR
from nbddp.wire import sources

_LAUNCH_FILES = ("runpy.py", "<frozen runpy>", "threading.py", "<string>")


def _launches(summary: traceback.FrameSummary) -> bool:
    """Whether a frame is one of those that only started the user's code."""
    name = summary.filename
    return name.startswith(NBDDP_DIR) or name.endswith(_LAUNCH_FILES)


def user_frames(frame: FrameType) -> tuple[list[traceback.FrameSummary], bool]:
    """A thread's stack, outermost first, without the frames that launched it.

    Returns the frames and whether any are the user's: a stack made only of
    launching frames is returned whole (with False), so nothing is hidden
    from a thread that never reached user code.
    """
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
