"""Framing of worker messages: any split of the byte stream yields the same messages."""

from __future__ import annotations

import socket

from nbddp.wire import protocol


def test_frames_survive_arbitrary_splits() -> None:
    data = protocol.encode("metrics", [{"loss": 1.5}]) + protocol.encode("result", b"x" * 100_000)
    for step in (1, 7, 4096, len(data)):
        reader = protocol.FrameReader()
        got = []
        for i in range(0, len(data), step):
            got += reader.feed(data[i : i + step])
        assert got == [("metrics", [{"loss": 1.5}]), ("result", b"x" * 100_000)]
        assert reader.pending == 0


def test_blocking_send_and_recv_over_a_socketpair() -> None:
    a, b = socket.socketpair()
    with a, b:
        protocol.send(a, "started", 42)
        assert protocol.recv(b) == ("started", 42)
        a.close()
        assert protocol.recv(b) is None
