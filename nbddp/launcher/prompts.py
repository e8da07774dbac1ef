"""Ranks waiting for the user: the prompt in the notebook, and the time it takes.

``ask_user(prompt)`` asks for one line where ``input()`` would; None
when nobody can answer (the rank reads end of input). ``ask_rank`` names the
rank in the prompt (``prompt_for``). ``WaitClock`` keeps which ranks wait and
for how long: the run's timeout leaves that time out (``owed``).
"""

from __future__ import annotations

import time
from collections.abc import Callable


def prompt_for(rank: int, prompt: str) -> str:
    """``(Pdb) [rank 1] ``: the rank's prompt, naming it."""
    head = prompt.rstrip()
    return f"{head} [rank {rank}] " if head else f"[rank {rank}] "


Asker = Callable[[int, str], "str | None"]
"""(rank, the rank's prompt) -> the user's line, None for end of input."""


def ask_rank(rank: int, prompt: str) -> str | None:
    """Ask where ``input()`` asks, the prompt naming ``rank``."""
    return ask_user(prompt_for(rank, prompt))


def ask_user(prompt: str) -> str | None:
    """One line from the user, or None when nobody can answer."""
    try:
        return input(prompt)
    # NotImplementedError: IPython's StdinNotImplementedError, no stdin in this frontend.
    except (EOFError, NotImplementedError):
        return None


PROMPT_RECHECK = 1.0  # seconds between timeout checks while a rank waits at a prompt


class WaitClock:
    """Ranks at a prompt, and the time spent there."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.waiting: set[int] = set()
        self._since = 0.0
        self._owed = 0.0

    def begin(self, rank: int) -> None:
        """``rank`` waits for the user."""
        if not self.waiting:
            self._since = self._clock()
        self.waiting.add(rank)

    def end(self, rank: int) -> None:
        """``rank`` has its answer (or is gone)."""
        if rank not in self.waiting:
            return
        self.waiting.discard(rank)
        if not self.waiting:
            self._owed += self._clock() - self._since

    def put_off(self) -> float | None:
        """For a timeout that fires: how much later to look again (time at a prompt is
        the user's); None: it stands."""
        owed = self.owed()
        return max(owed, PROMPT_RECHECK) if owed > 0 or self.waiting else None

    def owed(self) -> float:
        """Seconds some rank waited since the last call, the current wait included."""
        owed = self._owed
        if self.waiting:
            now = self._clock()
            owed += now - self._since
            self._since = now
        self._owed = 0.0
        return owed
