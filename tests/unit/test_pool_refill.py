"""When the forkserver refills its pool (``Pool.refill_in``): once no rank of its own
runs and none started or ended for ``REFILL_DELAY``; never while a rank runs, never
when the pool is full."""

from __future__ import annotations

import selectors
import socket
from collections.abc import Iterator

import pytest

from nbddp.forkserver import pool as pool_module
from nbddp.forkserver.pool import REFILL_DELAY, Pool, _Keeper


class Clock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(pool_module.time, "monotonic", fake)
    return fake


@pytest.fixture
def pool(clock: Clock) -> Iterator[Pool]:
    selector = selectors.DefaultSelector()
    made = Pool(selector)
    made.resize(2, 300.0)  # a launch of two ranks, just now
    yield made
    for keeper in (*made.free.values(), *made.busy.values()):
        keeper.link.close()
    selector.close()


def keeper(pool: Pool, pid: int, *, busy: bool = False, warm: bool = False) -> socket.socket:
    ours, theirs = socket.socketpair()
    (pool.busy if busy else pool.free)[pid] = _Keeper(ours, warm=warm)
    return theirs


def test_it_refills_once_nothing_ran_for_the_delay(pool: Pool, clock: Clock) -> None:
    assert pool.refill_in() == pytest.approx(REFILL_DELAY)
    clock.now += REFILL_DELAY / 2
    assert pool.refill_in() == pytest.approx(REFILL_DELAY / 2)
    clock.now += REFILL_DELAY
    assert pool.refill_in() == 0.0


def test_never_while_a_rank_of_its_own_runs(pool: Pool, clock: Clock) -> None:
    link = keeper(pool, 7, busy=True)
    clock.now += 60.0
    assert pool.refill_in() is None
    link.close()


def test_never_once_the_pool_holds_the_last_launchs_size(pool: Pool, clock: Clock) -> None:
    links = [keeper(pool, pid, warm=True) for pid in (1, 2)]
    clock.now += 60.0
    assert pool.refill_in() is None
    pool.resize(3, 300.0)  # a larger launch: one more is due after the delay
    clock.now += REFILL_DELAY
    assert pool.refill_in() == 0.0
    for link in links:
        link.close()


def test_a_rank_that_ends_restarts_the_delay(pool: Pool, clock: Clock) -> None:
    link = keeper(pool, 7, busy=True)
    pool._selector.register(pool.busy[7].link, selectors.EVENT_READ, 7)
    clock.now += 60.0
    link.sendall(b"F")  # the keeper says its rank's tree is gone
    pool.heard(7, listening=True)
    assert 7 in pool.free
    assert pool.refill_in() == pytest.approx(REFILL_DELAY)
    link.close()
