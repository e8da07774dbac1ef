"""``Channel.send_soon``: metric rows are batched, in order, and never held for long."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from nbddp import worker
from nbddp.protocol import FrameReader


@pytest.fixture
def pair() -> Iterator[tuple[worker.Channel, socket.socket]]:
    ours, theirs = socket.socketpair()
    theirs.settimeout(5.0)  # a blocking receive that cannot hang the suite
    yield worker.Channel(ours), theirs
    ours.close()
    theirs.close()


def receive(sock: socket.socket, count: int) -> list[tuple[str, object]]:
    reader, got = FrameReader(), []
    while len(got) < count:
        got.extend(reader.feed(sock.recv(1 << 16)))
    return got


def test_first_row_goes_at_once_then_rows_are_held_and_flushed(
    pair: tuple[worker.Channel, socket.socket],
) -> None:
    channel, peer = pair
    for step in range(100):
        channel.send_soon("metric", {"step": step})
    first = receive(peer, 1)
    assert first == [("metric", {"step": 0})]
    # The other 99 come within TAIL_INTERVAL, from the flusher thread.
    assert receive(peer, 99) == [("metric", {"step": s}) for s in range(1, 100)]


def test_send_goes_after_what_is_held(pair: tuple[worker.Channel, socket.socket]) -> None:
    channel, peer = pair
    channel.send_soon("metric", {"step": 0})
    channel.send_soon("metric", {"step": 1})
    channel.send("result", b"done")
    assert receive(peer, 3) == [
        ("metric", {"step": 0}),
        ("metric", {"step": 1}),
        ("result", b"done"),
    ]
