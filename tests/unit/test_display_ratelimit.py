"""The redraw rate limiter, driven by a fake clock."""

from __future__ import annotations

import pytest

from nbddp.display.model import RateLimiter


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_first_event_is_allowed_then_one_per_interval() -> None:
    clock = Clock()
    limiter = RateLimiter(0.1, clock)
    assert limiter.try_fire()
    assert not limiter.try_fire()
    clock.now += 0.05
    assert not limiter.ready()
    assert limiter.delay() == pytest.approx(0.05)
    clock.now += 0.05
    assert limiter.try_fire()


def test_bounded_rate_under_a_flood() -> None:
    clock = Clock()
    limiter = RateLimiter(0.1, clock)
    fired = 0
    for _ in range(100_000):  # 100k events over 10 simulated seconds
        clock.now += 0.0001
        fired += limiter.try_fire()
    assert 95 <= fired <= 101


def test_delay_is_zero_when_ready() -> None:
    limiter = RateLimiter(1.0, Clock())
    assert limiter.delay() == 0.0
    limiter.fire()
    assert limiter.delay() == pytest.approx(1.0)


def test_negative_interval_is_refused() -> None:
    with pytest.raises(ValueError):
        RateLimiter(-1)
