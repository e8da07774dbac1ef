"""What the notebook knows of each rank of a job, and how it signals the rank's processes.

Contract: a ``RankRecord`` is one rank's mutable record, written on the relay
loop only (``job.Job``); ``outcome()`` is a frozen copy for other threads.
``signal_group(pid, sig, tree)`` signals a rank's process group and, while the
rank is alive, every descendant that left it (``setsid``).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field, fields

import psutil

from nbddp.launcher.events import RankOutcome, RankState, StacksTaken
from nbddp.wire.descriptors import Packed
from nbddp.wire.protocol import ErrorInfo


@dataclass
class RankRecord:
    """What the notebook knows about one rank. Written on the relay loop only."""

    rank: int
    pid: int | None = None
    state: RankState = RankState.STARTING
    exit_code: int | None = None
    exited: bool = False
    closed: bool = False
    value: Packed | None = None
    error: ErrorInfo | None = None
    exit_request: int | None = None
    stacks: StacksTaken | None = None
    started_at: float = field(default_factory=time.monotonic)
    ended_at: float | None = None

    def outcome(self) -> RankOutcome:
        """A frozen copy, for other threads."""
        return RankOutcome(**{f.name: getattr(self, f.name) for f in fields(RankOutcome)})

    def signal(self, sig: int) -> bool:
        """Signal the rank's group (its tree while it lives); True if any process was there.
        Nothing once its pipes are closed: its group id may since be someone else's."""
        if self.pid is None or self.closed:
            return False
        return signal_group(self.pid, sig, tree=not self.exited)


def signal_group(pid: int, sig: int, *, tree: bool) -> bool:
    """Signal the process group led by ``pid``; with ``tree`` (only while it is our live
    rank: a reaped pid may be another's), its live descendants too."""
    alive = False
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
        alive = True
    if not tree:
        return alive
    # Descendants that left the group (setsid) are still found through the tree.
    with contextlib.suppress(psutil.Error):
        for proc in psutil.Process(pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                proc.send_signal(sig)
                alive = True
    return alive
