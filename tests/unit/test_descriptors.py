"""Descriptors travel beside a message's bytes, in order, in batches the kernel accepts."""

from __future__ import annotations

import os
import socket

from nbddp.wire import protocol
from nbddp.wire.descriptors import Descriptors
from nbddp.wire.protocol import FrameReader


def _read_all(sock: socket.socket, reader: FrameReader) -> list[tuple[str, object]]:
    got: list[tuple[str, object]] = []
    sock.setblocking(False)
    while True:
        try:
            data, anc, _, _ = sock.recvmsg(1 << 16, protocol.FD_SPACE)
        except BlockingIOError:
            return got
        got += reader.feed(data, protocol.received_fds(anc))


def test_more_descriptors_than_one_sendmsg_takes_arrive_with_their_message() -> None:
    before = len(os.listdir("/proc/self/fd"))
    ours, theirs = socket.socketpair()
    files = [os.memfd_create(f"t{i}") for i in range(600)]  # > 2 * MAX_FDS
    for i, fd in enumerate(files):
        os.write(fd, str(i).encode())
    with ours, theirs:
        data, fds = protocol.encode_with_fds("result", ("x", Descriptors(files), "y"))
        protocol.send_with_fds(theirs, protocol.encode("metrics", [1]) + data, fds)
        reader = FrameReader()
        got = _read_all(ours, reader)
        assert [kind for kind, _ in got] == ["metrics", "result"]
        _, (x, received, y) = got[1]  # type: ignore[misc]
        assert (x, y) == ("x", "y") and isinstance(received, Descriptors)
        assert len(received.fds) == 600 and received.missing == 0
        assert [os.pread(fd, 8, 0) for fd in received.fds] == [str(i).encode() for i in range(600)]
        received.close()
    for fd in files:
        os.close(fd)
    assert len(os.listdir("/proc/self/fd")) == before  # every received descriptor closed


def test_a_message_claiming_descriptors_that_never_came_says_how_many() -> None:
    data, fds = protocol.encode_with_fds("result", Descriptors([0, 1]))
    assert fds == [0, 1]
    reader = FrameReader()
    [(_, body)] = reader.feed(data, [])  # the kernel dropped them (out of fds)
    assert isinstance(body, Descriptors) and body.missing == 2 and len(body) == 2
