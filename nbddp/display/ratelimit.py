"""A rate limiter for redraws: at most one per ``interval`` seconds.

Contract: ``ready()`` is True when at least ``interval`` seconds have
passed since the last ``fire()`` (or if it never fired); ``delay()`` is how
long until it will be. The clock is injectable so tests need no sleeping.
It does not drop anything itself: callers keep what changed (a dirty flag)
and draw it when the limiter allows, and unconditionally at the end.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class RateLimiter:
    """Allows one event per ``interval`` seconds of ``clock``."""

    def __init__(self, interval: float, clock: Callable[[], float] = time.monotonic) -> None:
        if interval < 0:
            raise ValueError(f"interval must be >= 0, not {interval}")
        self.interval = interval
        self.clock = clock
        self._last: float | None = None

    def delay(self) -> float:
        """Seconds until ``ready()`` (0.0 when it already is)."""
        if self._last is None:
            return 0.0
        return max(0.0, self._last + self.interval - self.clock())

    def ready(self) -> bool:
        """True if an event may happen now."""
        return self.delay() <= 0.0

    def fire(self) -> None:
        """Record that the event happened now."""
        self._last = self.clock()

    def try_fire(self) -> bool:
        """``fire()`` and return True if ``ready()``; else False."""
        if not self.ready():
            return False
        self.fire()
        return True
