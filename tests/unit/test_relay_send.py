"""The relay sends a rank messages of any size whole and in order, descriptors with
them, without waiting on the rank; what its link cannot take is named."""

from __future__ import annotations

import concurrent.futures
import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nbddp.launcher.relay import RankPipes, Relay, Unsent, loop
from nbddp.wire import protocol
from nbddp.wire.descriptors import Descriptors
from tests.unit.test_relay_order import Recorder

MB = 1 << 20


def on_loop(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` run on the relay loop: its value, or its exception raised here."""
    done: concurrent.futures.Future[Any] = concurrent.futures.Future()

    def call() -> None:
        try:
            done.set_result(fn(*args))
        except BaseException as exc:
            done.set_exception(exc)

    loop().call(call)
    return done.result()


@pytest.fixture
def link(tmp_path: Path) -> Iterator[tuple[Relay, Recorder, socket.socket]]:
    """A relay with rank 0 attached; the rank's end of its link."""
    fds = [*os.pipe(), *os.pipe(), *os.pipe()]
    ours, theirs = socket.socketpair()
    sink = Recorder()
    relay = Relay(tmp_path, sink)
    relay.attach(0, RankPipes(fds[0], fds[2], ours, fds[4]))
    yield relay, sink, theirs
    theirs.close()
    for fd in fds[1::2]:
        os.close(fd)
    sink.wait_for(("closed", None))


def test_messages_larger_than_the_socket_arrive_whole_in_order_with_their_fds(
    link: tuple[Relay, Recorder, socket.socket],
) -> None:
    relay, _, theirs = link
    big = os.urandom(16 * MB)
    read_end, write_end = os.pipe()
    # Sent while the rank reads nothing: each call returns at once, the rest queued.
    on_loop(relay.send, 0, "answer", big)
    on_loop(relay.send, 0, "stacks", None)
    on_loop(relay.send, 0, "cell", ("order", Descriptors([read_end])))
    on_loop(relay.send, 0, "answer", big[:MB])
    os.close(read_end)  # the relay keeps its own copy until it is sent
    incoming = protocol.messages(theirs)
    got = [next(incoming) for _ in range(4)]
    assert [kind for kind, _ in got] == ["answer", "stacks", "cell", "answer"]
    assert got[0][1] == big and got[1][1] is None and got[3][1] == big[:MB]
    name, received = got[2][1]
    assert name == "order" and isinstance(received, Descriptors) and received.missing == 0
    os.write(write_end, b"same pipe")
    assert os.read(received.fds[0], 9) == b"same pipe"
    received.close()
    os.close(write_end)


def test_a_closed_link_names_the_rank_and_message_it_could_not_take(
    link: tuple[Relay, Recorder, socket.socket],
) -> None:
    relay, sink, theirs = link
    answer = os.urandom(16 * MB)  # more than the socket holds
    size = len(protocol.encode_with_fds("answer", answer)[0])
    on_loop(relay.send, 0, "answer", answer)
    theirs.close()
    sink.wait_for(("link_closed", [f"its 'answer' message ({size:,} bytes)"]))
    with pytest.raises(Unsent, match="rank 0's 'stacks' message was not sent"):
        on_loop(relay.send, 0, "stacks", None)
