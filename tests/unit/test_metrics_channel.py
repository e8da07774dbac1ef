"""``Channel.send_row``: metric rows are batched, in order, and never held for long."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from nbddp.rank import channel as channel_module
from nbddp.rank.channel import Channel
from nbddp.wire.protocol import FrameReader


@pytest.fixture
def pair() -> Iterator[tuple[Channel, socket.socket]]:
    ours, theirs = socket.socketpair()
    theirs.settimeout(5.0)  # a blocking receive that cannot hang the suite
    channel = Channel(ours)
    yield channel, theirs
    ours.close()
    theirs.close()
    flusher = channel._flusher
    if flusher is not None:  # ends at its next wakeup now that the socket is closed
        flusher.join(timeout=5.0)


def receive(sock: socket.socket, count: int) -> list[tuple[str, Any]]:
    reader, got = FrameReader(), []
    while len(got) < count:
        got.extend(reader.feed(sock.recv(1 << 16)))
    return got


def test_first_row_goes_at_once_then_rows_are_held_and_flushed(
    pair: tuple[Channel, socket.socket],
) -> None:
    channel, peer = pair
    for step in range(100):
        channel.send_row({"step": step})
    first = receive(peer, 1)
    assert first == [("metrics", [{"step": 0}])]
    # The other 99 come within TAIL_INTERVAL, from the flusher thread, as one message.
    assert receive(peer, 1) == [("metrics", [{"step": s} for s in range(1, 100)])]


def test_a_flusher_that_ended_is_started_again_by_the_next_rows(
    pair: tuple[Channel, socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The flusher ends after one idle wakeup here (FLUSHER_IDLE), so each burst
    # finds none: its first row goes at once and starts a new flusher, which
    # must send the second (held) row.
    monkeypatch.setattr(channel_module, "FLUSHER_IDLE", 1)
    channel, peer = pair
    ended: list[threading.Thread] = []
    for burst in range(3):
        channel.send_row({"burst": burst, "i": 0})
        channel.send_row({"burst": burst, "i": 1})
        flusher = channel._flusher
        assert flusher is not None and flusher not in ended
        rows = [row for _, batch in receive(peer, 1) for row in batch]
        while len(rows) < 2:
            rows += [row for _, batch in receive(peer, 1) for row in batch]
        assert rows == [{"burst": burst, "i": 0}, {"burst": burst, "i": 1}]
        flusher.join(timeout=5.0)  # idle now: it unregisters and ends
        assert not flusher.is_alive() and channel._flusher is None
        ended.append(flusher)


def test_send_goes_after_what_is_held(pair: tuple[Channel, socket.socket]) -> None:
    channel, peer = pair
    channel.send_row({"step": 0})
    channel.send_row({"step": 1})
    channel.send("result", b"done")
    assert receive(peer, 3) == [
        ("metrics", [{"step": 0}]),
        ("metrics", [{"step": 1}]),
        ("result", b"done"),
    ]
