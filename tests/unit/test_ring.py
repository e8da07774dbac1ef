"""The shared-memory output ring, both ends in one process (no rank)."""

from __future__ import annotations

import io
import os
import threading
from collections.abc import Iterator

import pytest

from nbddp import ring
from nbddp.ring import RingReader, RingWriter

SMALL = 1 << 12  # data bytes: small enough to wrap and fill in a test


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    r, w = os.pipe()
    os.set_blocking(r, False)
    yield r, w
    os.close(r)
    os.close(w)


def pair(pipe_fd: int, capacity: int = SMALL, wait: object = None) -> tuple[RingReader, RingWriter]:
    reader = RingReader(capacity)
    writer = RingWriter(reader.fd, pipe_fd, wait or (lambda timeout: None))  # type: ignore[arg-type]
    reader.close_fd()
    return reader, writer


def read_pipe(fd: int) -> bytes:
    try:
        return os.read(fd, 1 << 20)
    except BlockingIOError:
        return b""


def test_bytes_come_out_once_in_order_across_the_wrap(pipe: tuple[int, int]) -> None:
    reader, writer = pair(pipe[1])
    sent = []
    for i in range(200):  # about 5 times round a 4 KiB ring, drained as it goes
        chunk = f"line {i} {'x' * (i % 37)}\n".encode()
        assert writer.write(chunk) == len(chunk)
        sent.append(chunk)
        if i % 7 == 0:
            assert reader.drain() == b"".join(sent)
            sent.clear()
    assert reader.drain() == b"".join(sent)
    assert reader.drain() == b""
    assert read_pipe(pipe[0]) == b""  # nothing went to the pipe
    reader.close()


def test_any_bytes_like_object_is_accepted(pipe: tuple[int, int]) -> None:
    reader, writer = pair(pipe[1])
    writer.write(bytearray(b"ab"))
    writer.write(memoryview(b"cd"))
    assert reader.drain() == b"abcd"
    reader.close()


def test_a_full_ring_makes_the_writer_wait_until_the_reader_drains(pipe: tuple[int, int]) -> None:
    # The wait stands in for the notebook: it drains, as the relay does on a
    # tick, and answers the writer's waiting mark.
    received = bytearray()
    waits = []
    marks = []

    def wait_for_space(timeout: float) -> None:
        waits.append(timeout)
        marks.append(reader.take_waiting())
        received.extend(reader.drain())

    reader, writer = pair(pipe[1], wait=wait_for_space)
    data = bytes(range(256)) * 70  # 17,920 bytes through a 4,096-byte ring
    writer.write(data)
    received.extend(reader.drain())
    assert bytes(received) == data
    assert len(waits) >= len(data) // SMALL - 1
    assert all(marks)  # each wait was marked, so the relay would have sent "space"
    assert not reader.take_waiting()  # the mark is taken once
    reader.close()


def test_a_writer_blocked_in_another_thread_resumes_after_a_drain(pipe: tuple[int, int]) -> None:
    space = threading.Event()

    def wait_for_space(timeout: float) -> None:
        space.wait(timeout)
        space.clear()

    reader, writer = pair(pipe[1], wait=wait_for_space)
    writer.write(b"a" * SMALL)  # full
    done = threading.Event()
    thread = threading.Thread(target=lambda: (writer.write(b"b" * 100), done.set()))
    thread.start()
    assert not done.wait(0.2)  # blocked: the ring has no room
    assert reader.drain() == b"a" * SMALL
    space.set()  # what the link watcher does on "space"
    thread.join(timeout=5)
    assert done.is_set()
    assert reader.drain() == b"b" * 100
    reader.close()


def test_in_a_forked_child_writes_go_to_the_pipe(pipe: tuple[int, int]) -> None:
    reader, writer = pair(pipe[1])
    writer.write(b"parent\n")
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        ring._after_fork_in_child()  # what os.register_at_fork runs (install registers it)
        writer.write(b"child ")  # as print writes: the text, then the newline
        writer.write(b"line\n")
        writer.write(b"partial")
        writer.flush()
        os._exit(0)
    os.waitpid(pid, 0)
    assert reader.drain() == b"parent\n"
    chunks = []
    while data := read_pipe(pipe[0]):
        chunks.append(data)
    assert b"".join(chunks) == b"child line\npartial"
    reader.close()


def test_a_write_from_inside_a_write_goes_to_the_pipe(pipe: tuple[int, int]) -> None:
    # A signal handler that prints while this thread is inside write(): the
    # ring's positions are mid-update, so that write takes the pipe.
    reader, writer = pair(pipe[1])
    writer._owner = threading.get_ident()
    writer.write(b"from a handler\n")
    writer._owner = 0
    assert read_pipe(pipe[0]) == b"from a handler\n"
    assert reader.drain() == b""
    reader.close()


def test_text_layer_over_the_ring_sends_partial_lines_at_once(pipe: tuple[int, int]) -> None:
    reader, writer = pair(pipe[1])
    text = io.TextIOWrapper(
        writer,  # type: ignore[type-var]
        encoding="utf-8",
        line_buffering=True,
        write_through=True,
    )
    text.write("\r 50%|#####     |")  # a tqdm redraw: no newline, no flush
    assert reader.drain() == b"\r 50%|#####     |"
    print("héllo", file=text)
    assert reader.drain() == "héllo\n".encode()
    assert text.fileno() == pipe[1]
    assert not text.isatty()
    reader.close()


def test_a_file_that_is_not_a_ring_is_refused(tmp_path: object) -> None:
    fd = os.memfd_create("not-a-ring")
    try:
        os.ftruncate(fd, ring.HEADER + 1000)  # not a power of two
        with pytest.raises(ValueError, match="not an nbddp ring"):
            RingWriter(fd, 1, lambda timeout: None)
    finally:
        os.close(fd)


def test_rings_can_be_turned_off() -> None:
    assert not ring.enabled({"NBDDP_RING": "0"})
    assert ring.enabled({}) == ring.enabled({"NBDDP_RING": "1"})
