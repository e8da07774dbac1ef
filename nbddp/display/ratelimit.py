"""A rate limiter for redraws: ``ready()`` once ``interval`` seconds passed since the last
``fire()`` (or never fired), ``delay()`` until then; the clock is injectable. It drops nothing:
callers keep a dirty flag, draw when allowed, and always at the end.
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
        return 0.0 if self._last is None else max(0.0, self._last + self.interval - self.clock())

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
