"""Ranks waiting for the user: the prompt in the notebook and the time it takes.

``ask_user(prompt)`` asks for one line where ``input()`` would (``getpass`` for a password);
None at end of input, ``NO_STDIN`` where the frontend has no stdin. ``ask_rank`` names the
rank (``prompt_for``); ``withdraw_prompt`` ends a wait nobody needs answered. ``WaitClock``
keeps which ranks wait and for how long: the run's timeout leaves that time out (``owed``).
"""

from __future__ import annotations

import getpass
import signal
import threading
import time
from collections.abc import Callable

from nbddp.wire.protocol import NO_STDIN, Answer


def prompt_for(rank: int, prompt: str) -> str:
    """``(Pdb) [rank 1] ``: the rank's prompt, naming it."""
    head = prompt.rstrip()
    return f"{head} [rank {rank}] " if head else f"[rank {rank}] "


Asker = Callable[[int, str, bool], Answer]
"""(rank, the rank's prompt, whether for a password) -> the user's ``Answer``."""


def ask_rank(rank: int, prompt: str, password: bool = False) -> Answer:
    """Ask where ``input()`` asks, the prompt naming ``rank``."""
    return ask_user(prompt_for(rank, prompt), password)


def ask_user(prompt: str, password: bool = False) -> Answer:
    """One line from the user (``password``: as ``getpass`` asks; ipykernel routes it to a
    password box); None at end of input; ``NO_STDIN`` when this frontend cannot ask."""
    try:
        return getpass.getpass(prompt) if password else input(prompt)
    except EOFError:
        return None
    except NotImplementedError:  # IPython's StdinNotImplementedError: no stdin here
        return NO_STDIN


def withdraw_prompt(asking: threading.Thread) -> None:
    """End the ``ask_user`` that ``asking`` waits in: a SIGINT to the main thread (which
    interrupts its read) raises ``KeyboardInterrupt`` there, where Python's own handler is
    installed; a wait in any other thread cannot be ended from outside."""
    pythons_own = signal.getsignal(signal.SIGINT) is signal.default_int_handler
    if asking is threading.main_thread() and pythons_own:
        signal.pthread_kill(asking.ident or 0, signal.SIGINT)


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
