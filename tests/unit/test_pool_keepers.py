"""The forkserver's bookkeeping of its keepers (``forkserver.pool.Pool``), without forking.

Each keeper here is the far end of a real socketpair, so what the pool sends
(``keeper.RUN`` with a rank's fds, ``keeper.WARM``) is read back as a keeper
would; ending a keeper is a SIGKILL, recorded instead of sent.
"""

from __future__ import annotations

import os
import selectors
import socket
from collections.abc import Iterator

import pytest

from nbddp.forkserver import keeper as orders
from nbddp.forkserver.pool import Pool, _Keeper


@pytest.fixture
def pool() -> Iterator[Pool]:
    selector = selectors.DefaultSelector()
    made = Pool(selector)
    made.size = 2
    yield made
    for keeper in (*made.free.values(), *made.busy.values()):
        keeper.link.close()
    selector.close()


def add(pool: Pool, pid: int, *, busy: bool = False, warm: bool = False) -> socket.socket:
    """A keeper known to ``pool``; the keeper's end of its link."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    (pool.busy if busy else pool.free)[pid] = _Keeper(ours, warm=warm)
    pool._selector.register(ours, selectors.EVENT_READ, pid)
    return theirs


def rank_fds() -> list[int]:
    r, w = os.pipe()
    return [r, w, os.dup(r), os.dup(w)]


def received(link: socket.socket) -> tuple[bytes, int]:
    """What a keeper reads: the order, and how many fds came with it."""
    link.settimeout(5.0)  # an order that never comes fails the test, not the session
    msg, fds, _, _ = socket.recv_fds(link, 1, orders.RANK_FDS)
    for fd in fds:
        os.close(fd)
    return msg, len(fds)


def test_a_rank_goes_to_a_warm_keeper_first_then_the_oldest_free_one(pool: Pool) -> None:
    cold_old, warm, cold_young = add(pool, 1), add(pool, 2, warm=True), add(pool, 3)
    fds = rank_fds()
    try:
        assert pool.hand_over(fds) == 2
        assert received(warm) == (orders.RUN, 4)
        assert pool.hand_over(fds) == 1
        assert received(cold_old) == (orders.RUN, 4)
        assert set(pool.busy) == {1, 2} and list(pool.free) == [3]
        assert not pool.busy[2].warm  # its worker is the rank now
    finally:
        for fd in fds:
            os.close(fd)
        for link in (cold_old, warm, cold_young):
            link.close()


def test_no_free_keeper_means_none_and_a_dead_one_is_passed_over(
    pool: Pool, killed: list[int]
) -> None:
    add(pool, 1).close()  # it died while free
    alive = add(pool, 2)
    fds = rank_fds()
    try:
        assert pool.hand_over(fds) == 2
        assert pool.hand_over(fds) is None
        assert pool.ending == {1} and killed == [1]
    finally:
        for fd in fds:
            os.close(fd)
        alive.close()


def test_a_keeper_whose_rank_ended_is_kept_free_up_to_the_size(
    pool: Pool, killed: list[int]
) -> None:
    links = [add(pool, pid, busy=True) for pid in (1, 2, 3)]
    pool.size = 2
    for pid, link in zip((1, 2, 3), links, strict=True):
        link.sendall(orders.FREE)
        pool.heard(pid, listening=True)
    assert list(pool.free) == [1, 2] and not pool.busy
    assert killed == [3] and pool.ending == {3}  # one more than a launch needs
    for link in links:
        link.close()


def test_a_keeper_freed_once_the_forkserver_stops_listening_is_ended(
    pool: Pool, killed: list[int]
) -> None:
    link = add(pool, 1, busy=True)
    link.sendall(orders.FREE)
    pool.heard(1, listening=False)
    assert not pool.free and not pool.busy and killed == [1]
    link.close()


def test_a_keeper_whose_link_closes_or_says_something_else_is_dropped(
    pool: Pool, killed: list[int]
) -> None:
    add(pool, 1, busy=True).close()
    odd = add(pool, 2, busy=True)
    odd.sendall(b"?")
    pool.heard(1, listening=True)
    pool.heard(2, listening=True)
    assert not pool.busy and pool.ending == {1, 2} and killed == [1, 2]
    odd.close()


def test_a_refill_warms_a_cold_free_keeper_before_forking_a_new_one(
    pool: Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    forked: list[object] = []
    monkeypatch.setattr(Pool, "start_keeper", lambda self, close, fds: forked.append(fds))
    cold = add(pool, 1)
    assert pool.warm() < pool.size
    pool.warm_one(set())
    assert cold.recv(1) == orders.WARM and pool.free[1].warm and not forked
    pool.warm_one(set())
    assert forked == [None]  # none cold is left: a new warm keeper
    cold.close()


def test_a_smaller_launch_ends_cold_keepers_first_youngest_first(
    pool: Pool, killed: list[int]
) -> None:
    links = [add(pool, 1, warm=True), add(pool, 2), add(pool, 3, warm=True), add(pool, 4)]
    pool.resize(2, 10.0)
    assert list(pool.free) == [1, 3] and killed == [4, 2]
    for link in links:
        link.close()


def test_a_reaped_keeper_is_forgotten_wherever_it_was(pool: Pool, killed: list[int]) -> None:
    links = [add(pool, 1, warm=True), add(pool, 2, busy=True), add(pool, 3)]
    pool.resize(3, 10.0)
    assert pool.forget(1)  # died while free: the pool holds no more than it still has
    assert pool.size == 0
    assert pool.forget(2) and not pool.busy  # died keeping a rank
    pool._end(3)
    assert pool.forget(3) and not pool.ending
    assert not pool.forget(99)  # an orphan re-parented to the forkserver
    assert pool.fds() == set()
    for link in links:
        link.close()


def test_a_request_finds_the_keeper_that_said_free_before_it_was_heard(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A keeper says it is free only after reporting its rank's exit code, so the
    notebook's next request may reach the forkserver first: it must still go to
    that keeper, not to a keeper forked for it."""
    from nbddp.forkserver.server import REQUEST, Forkserver

    forked: list[object] = []
    monkeypatch.setattr(Pool, "start_keeper", lambda self, close, fds: forked.append(fds))
    notebook, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    server = Forkserver(theirs)
    keeper = add(server.pool, 1, busy=True)
    keeper.sendall(orders.FREE)  # said, not yet heard
    fds = rank_fds()
    try:
        socket.send_fds(notebook, [REQUEST.pack(b"F", 1, 10.0)], fds)
        assert server._serve_request()
        assert received(keeper) == (orders.RUN, 4) and not forked
        assert list(server.pool.busy) == [1]
    finally:
        for fd in fds:
            os.close(fd)
        for end in (notebook, theirs, keeper, *(k.link for k in server.pool.busy.values())):
            end.close()
        server.pool.busy.clear()
        os.close(server.wake_r)
        os.close(server.wake_w)
        server.selector.close()
