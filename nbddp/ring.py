"""Shared-memory rings that carry a rank's Python-level stdout and stderr.

Contract: the notebook makes a ``RingReader`` per rank and stream (a memfd
mapped shared, ``CAPACITY`` bytes of data), sends its ``fd`` with the
rank's order and then closes it (``close_fd``); the rank passes the fds to
``install``, which puts ``sys.stdout``/``sys.stderr`` over ``RingWriter``s.
From then on every ``write`` to those streams is copied into the ring at
once: no system call, and nothing held in the process (partial lines and
tqdm redraws included), so what a rank wrote survives the rank being
killed (SIGKILL, a segfault) as it would in a pipe. The relay calls
``drain()`` on every tick and before each read of the stream's pipe; bytes
come out exactly once, in the order they were written.

Why: one ``write`` system call per printed line costs a training step far
more than the call itself (tens of microseconds in a loop of sub-millisecond
steps on a virtual machine, where each system call also disturbs the
step's caches and TLB); a copy into shared memory costs about what a
``print`` to a line-buffered /dev/null costs.

Order: C-level writes to fd 1/2 (NCCL and gloo warnings, faulthandler
dumps, ``os.write``, subprocesses) still go through the pipes. The relay
drains a stream's ring before reading its pipe, so Python output followed
by C output (a traceback, then a crash dump) keeps its order; C output
followed at once by Python output may come out Python first.

Full ring: the writer copies what fits, marks itself waiting, and blocks
(``wait_for_space``, woken by the notebook's ``space`` message after a
drain, re-checking at least every ``SPACE_POLL`` seconds in case the
wake-up crossed the mark) until the notebook has read enough. Nothing is
dropped; a rank that out-writes the notebook is slowed to its pace, as a
full pipe would.

Forks: a child forked from the rank (a DataLoader worker) must not write
into the ring beside its parent (one writer per ring), so after a fork
every writer in the child writes to its pipe fd instead. Processes started
with spawn inherit fd 1/2, the pipes.

Memory order: the writer stores the bytes, then the new write position;
the reader loads the position, then the bytes. x86-64 keeps stores in
order and loads in order, which is all this needs; Python has no memory
barriers, so on other machines (``enabled()`` is False) streams stay on
the pipes.

Non-goals: several writer processes on one ring, readers other than the
notebook's relay.
"""

from __future__ import annotations

import io
import mmap
import os
import platform
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

CAPACITY = 4 << 20  # data bytes per ring; a power of two
HEADER = mmap.PAGESIZE  # control words live in the first page; data starts on the next
SPACE_POLL = 0.05  # seconds a blocked writer waits before looking at the ring again
# Control words (8 bytes each, each on its own cache line): write position
# (the rank's), read position (the notebook's), and the writer's "waiting" mark.
_WRITE, _READ, _WAITING = 0, 8, 16

_WRITERS: weakref.WeakSet[RingWriter] = weakref.WeakSet()


def enabled(environ: dict[str, str] | None = None) -> bool:
    """Whether rings are used: on x86-64 (see module doc), unless ``NBDDP_RING=0``."""
    env = os.environ if environ is None else environ
    machine = platform.machine().lower()
    return machine in ("x86_64", "amd64") and env.get("NBDDP_RING", "1").strip() != "0"


def _map(fd: int) -> tuple[mmap.mmap, memoryview, memoryview, int]:
    size = os.fstat(fd).st_size
    capacity = size - HEADER
    if capacity <= 0 or capacity & (capacity - 1):
        raise ValueError(f"not an nbddp ring: {size} bytes")
    region = mmap.mmap(fd, size, flags=mmap.MAP_SHARED)
    view = memoryview(region)
    return region, view[:HEADER].cast("Q"), view[HEADER:], capacity


class RingReader:
    """The notebook's side of one ring (see module contract). Used by one thread."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        self.fd = os.memfd_create("nbddp-ring", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, HEADER + capacity)
            self._region, self._words, self._data, self._capacity = _map(self.fd)
        except BaseException:
            os.close(self.fd)
            raise
        self._read = 0

    def close_fd(self) -> None:
        """Close the descriptor once sent: the mapping stays."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def drain(self) -> bytes:
        """Everything written since the last drain (b"" if nothing)."""
        write = self._words[_WRITE // 8]
        count = write - self._read
        if count <= 0:
            return b""
        if count > self._capacity:  # cannot happen with our writer; never read garbage
            count = self._capacity
            self._read = write - count
        start = self._read & (self._capacity - 1)
        end = start + count
        if end <= self._capacity:
            data = bytes(self._data[start:end])
        else:
            data = bytes(self._data[start:]) + bytes(self._data[: end - self._capacity])
        self._read = write
        self._words[_READ // 8] = write
        return data

    def take_waiting(self) -> bool:
        """True (once) if the writer is blocked waiting for space: send it ``space``."""
        if self._words[_WAITING // 8]:
            self._words[_WAITING // 8] = 0
            return True
        return False

    def close(self) -> None:
        """Release the mapping (and the descriptor, if still open)."""
        self.close_fd()
        self._words.release()
        self._data.release()
        self._region.close()


class RingWriter(io.RawIOBase):
    """The rank's side of one ring: a raw stream under ``sys.stdout``/``sys.stderr``.

    ``fileno()`` is the stream's pipe fd (1 or 2), so code that needs a real
    descriptor (faulthandler, subprocess) writes to the pipe.
    """

    def __init__(self, ring_fd: int, pipe_fd: int, wait_for_space: Callable[[float], object]):
        super().__init__()
        self._region, self._words, self._data, self._capacity = _map(ring_fd)
        self._mask = self._capacity - 1
        self._write = self._words[_WRITE // 8]
        self._pipe_fd = pipe_fd
        self._wait_for_space = wait_for_space
        self._lock = threading.Lock()
        self._owner = 0  # thread ident inside write(): a signal handler there must not re-enter
        self.forked = False  # set in a forked child: write to the pipe instead
        _WRITERS.add(self)

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._pipe_fd

    def write(self, b: Any) -> int:
        data = b if type(b) is bytes else bytes(b)
        ident = threading.get_ident()
        if self.forked or self._owner == ident:
            # A forked child, or a signal handler that interrupted a write on
            # this thread (the ring's positions are mid-update): the pipe.
            return self._write_pipe(data)
        with self._lock:
            self._owner = ident
            try:
                self._put(data)
            finally:
                self._owner = 0
        return len(data)

    def _put(self, data: bytes) -> None:
        count = len(data)
        write = self._write
        if count <= self._capacity - (write - self._words[_READ // 8]):
            self._copy(write, data)
            return
        view = memoryview(data)
        while view:
            free = self._capacity - (self._write - self._words[_READ // 8])
            if free <= 0:
                self._block()
                continue
            self._copy(self._write, view[:free])
            view = view[free:]

    def _copy(self, write: int, data: bytes | memoryview) -> None:
        count = len(data)
        start = write & self._mask
        end = start + count
        if end <= self._capacity:
            self._data[start:end] = data
        else:
            split = self._capacity - start
            self._data[start:] = data[:split]
            self._data[: count - split] = data[split:]
        # The bytes first, then the position that publishes them (module doc: memory order).
        self._write = write + count
        self._words[_WRITE // 8] = write + count

    def _block(self) -> None:
        self._words[_WAITING // 8] = 1
        if self._capacity - (self._write - self._words[_READ // 8]) <= 0:
            self._wait_for_space(SPACE_POLL)

    def _write_pipe(self, data: bytes) -> int:
        view = memoryview(data)
        while view:
            view = view[os.write(self._pipe_fd, view) :]
        return len(data)


def _after_fork_in_child() -> None:
    for writer in list(_WRITERS):
        writer.forked = True


_FORK_HOOK = False


def install(ring_fds: Sequence[int], wait_for_space: Callable[[float], object]) -> None:
    """In a rank: ``sys.stdout`` and ``sys.stderr`` write into the rings ``ring_fds``
    (stdout's, stderr's). The fds are closed (the mappings stay); whatever the old
    streams held is flushed to the pipes first."""
    global _FORK_HOOK
    import sys

    if not _FORK_HOOK:
        os.register_at_fork(after_in_child=_after_fork_in_child)
        _FORK_HOOK = True
    streams = []
    for ring_fd, pipe_fd in zip(ring_fds, (1, 2), strict=False):
        try:
            raw = RingWriter(ring_fd, pipe_fd, wait_for_space)
        finally:
            os.close(ring_fd)
        # A raw stream under the text layer, with no buffer between: each
        # write reaches the ring at once (typeshed expects a buffered one).
        streams.append(
            io.TextIOWrapper(  # type: ignore[type-var]
                raw,
                encoding="utf-8",
                errors="backslashreplace",
                line_buffering=True,
                write_through=True,
            )
        )
    for old in (sys.stdout, sys.stderr):
        try:
            old.flush()
        except (OSError, ValueError, AttributeError):
            pass
    if streams:
        sys.stdout = streams[0]
    if len(streams) > 1:
        sys.stderr = streams[1]
