"""A run in one line, as ``repr(run)`` and a cell showing a ``Run`` say it.

``run_line`` is ``<run id>: <status>, <n> ranks (<count> <state>, …), <elapsed>``;
``run_html`` is it as escaped HTML, with the log directory.
"""

from __future__ import annotations

import html
from collections import Counter
from collections.abc import Iterable
from pathlib import Path


def format_elapsed(seconds: float) -> str:
    """``7s``, ``3m05s`` or ``1h02m``."""
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def run_line(run_id: str, status: str, states: Iterable[str], elapsed: float) -> str:
    """``<run id>: <status>, <n> ranks (<count> <state>, …), <elapsed>``."""
    counts = Counter(str(state) for state in states)
    world = sum(counts.values())
    ranks = ", ".join(f"{count} {state}" for state, count in counts.items())
    noun = "rank" if world == 1 else "ranks"
    return f"{run_id}: {status}, {world} {noun} ({ranks}), {format_elapsed(elapsed)}"


def run_html(line: str, log_dir: Path) -> str:
    """``line`` and where the run's logs are, as HTML (all of it escaped)."""
    return (
        '<div class="nbddp-run" style="font-family:monospace">'
        f"nbddp run {html.escape(line)}<br>"
        f'<span style="opacity:0.7">logs in {html.escape(str(log_dir))}</span></div>'
    )
