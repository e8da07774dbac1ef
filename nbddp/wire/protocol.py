"""Messages between the notebook and a worker, over a private socketpair.

A message is ``(kind, body)``, pickled and framed with an 8-byte length; only the one worker that
inherited the socketpair can write to it. Worker -> notebook: ``started``, ``result``, ``error``,
``metrics``, ``exit``, ``stacks``, ``cell_done``, ``regrouped``, ``input``. Notebook -> worker:
``run`` first, ``stacks`` and ``answer`` at any time; to a session rank
(``nbddp.rank.session_loop``) also ``cell``, ``interrupt``, ``close_group``, ``regroup``, ``end``.
A ``Descriptors`` in a body travels as a count, its fds beside the first bytes (SCM_RIGHTS), and
comes back owning what the ``FrameReader`` received.
"""

from __future__ import annotations

import array
import enum
import io
import pickle
import signal
import socket
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from nbddp.wire.descriptors import Descriptors, Packed

HEADER = struct.Struct("!Q")
MAX_FRAME = 1 << 40
MAX_FDS = 250  # descriptors per sendmsg: the kernel takes at most 253 (SCM_MAX_FD)
FD_SPACE = socket.CMSG_SPACE(MAX_FDS * array.array("i").itemsize)
"""Ancillary buffer a receiver gives ``recvmsg``: room for one sendmsg's descriptors."""

# The signal that makes faulthandler dump a rank's stacks from C, for a rank
# that cannot answer ``stacks`` (a thread holds the GIL). Why a real-time
# signal, not SIGUSR1: user code claims SIGUSR1 for itself (checkpoint on
# signal) and would take ours; Linux's top real-time signals are seldom used.
_RTMAX = getattr(signal, "SIGRTMAX", None)
STACKS_SIGNAL = int(_RTMAX) - 3 if _RTMAX is not None else int(signal.SIGUSR1)

Body = Any
"""A message's body: its type is the one its kind names (see the module contract)."""
Message = tuple[str, Body]
MetricRow = dict[str, float | int | None]
"""A row of ``nbddp.log``: ``rank``, ``step`` (None when not given), ``time`` and the
values logged; what the notebook receives is checked again where it is drawn."""
DeviceKind = Literal["cuda", "cpu", "inherit"]
Backend = Literal["nccl", "gloo"]


@dataclass(frozen=True)
class Placement:
    """Where a rank sits in its run. In the rank, the worker installs it as the
    rank's context (``nbddp.rank.context``)."""

    rank: int
    local_rank: int
    world_size: int
    device: DeviceKind
    """cuda: one GPU, ``cuda_index``; cpu: GPUs hidden; inherit: the notebook's GPUs
    are visible and the rank's code chooses (``spawn()``)."""
    cuda_index: int | None = None
    """The CUDA device the rank uses (among those it sees); None unless ``device`` is cuda."""


@dataclass(frozen=True)
class CallRef:
    """A call for a rank to make (``payload.load_call``): its pickled bytes in a memory
    file (``fds[0]``, ``size`` bytes), then the shared memory those bytes refer to.

    Why a memory file, not the message: one write serves every rank."""

    size: int
    fds: Descriptors


@dataclass(frozen=True)
class RunOrder:
    """What a worker needs to run its rank: every value typed; ``env`` is for the user's code."""

    place: Placement
    env: dict[str, str]
    """The rank's whole environment (``RANK``, ``MASTER_PORT``...), set before the call."""
    call: CallRef
    sys_path: list[str]
    cwd: str
    backend: Backend
    init_process_group: bool
    """Initialise the default process group (``backend``) before the call."""
    threads: int | None = None
    """``torch.set_num_threads`` for a rank whose torch was imported before its
    environment was set (forkserver, fork); None leaves torch's own choice."""
    debug: bool = False
    """Open a debugger on the frame that raised, before reporting the error."""


@dataclass(frozen=True)
class ErrorInfo:
    """A rank's exception, in a form that always crosses the process boundary."""

    type_name: str
    message: str
    traceback: str
    exc: Packed | None
    """The exception itself, packed as a return value is (``values.pack``: its large
    tensors in shared memory), when it rebuilds as its own type; else None."""
    raised_at: float | None = None
    """``time.time()`` in the rank when the exception reached nbddp's worker: which
    rank failed first, whatever order the notebook reads their messages in."""
    full_traceback: str | None = None
    """The traceback as the rank's log keeps it, nbddp's own frames too (``traceback``
    leaves them out); None: the same as ``traceback``."""

    @property
    def logged(self) -> str:
        return self.full_traceback or self.traceback


@dataclass(frozen=True)
class CellOrder:
    """One call for a session's ranks to make (``nbddp.rank.session_loop``)."""

    cell: int
    """The cell's number in its session, from 1."""
    call: CallRef
    debug: bool = False
    """Open a debugger on the frame that raised, before replying."""


@dataclass(frozen=True)
class InputRequest:
    """A rank waits for one line from the user (``input()``, a debugger's prompt)."""

    number: int
    """The rank's count of its requests, from 1: an answer names the one it is for."""
    prompt: str
    password: bool = False
    """Asked by ``getpass``: the notebook asks for a password (not shown as typed)."""


class NoStdin(enum.Enum):
    """An answer that is no line: the notebook's frontend cannot take input."""

    NO_STDIN = "no stdin"


NO_STDIN = NoStdin.NO_STDIN
Answer = str | None | NoStdin
"""The user's line; None: no more input (EOF); ``NO_STDIN``: nobody can be asked."""


@dataclass(frozen=True)
class InputAnswer:
    """The ``Answer`` to a rank's ``InputRequest``."""

    number: int
    text: Answer


@dataclass(frozen=True)
class CellReply:
    """A session rank's answer to a ``CellOrder``: it is idle again."""

    cell: int
    value: Packed | None
    """What the call returned, packed; None when it raised."""
    error: ErrorInfo | None
    names: tuple[str, ...]
    """The names that belong to the rank (bound by session cells), sorted."""
    device_bytes: int | None = None
    """GPU memory the rank's torch held after the cell; None without CUDA."""


class _FramePickler(pickle.Pickler):
    """Pickles a message, collecting the descriptors of every ``Descriptors`` in it."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.fds: list[int] = []

    def persistent_id(self, obj: object) -> tuple[str, int] | None:
        if type(obj) is Descriptors:
            self.fds.extend(obj.fds)
            return ("fds", len(obj.fds))
        return None


def encode_with_fds(kind: str, body: object) -> tuple[bytes, list[int]]:
    """One framed message and the descriptors to send with it (``send_with_fds``)."""
    buf = io.BytesIO()
    buf.write(bytes(HEADER.size))
    pickler = _FramePickler(buf)
    pickler.dump((kind, body))
    data = buf.getbuffer()
    HEADER.pack_into(data, 0, len(data) - HEADER.size)
    if len(pickler.fds) > MAX_FDS * len(data):
        raise ValueError(f"{len(pickler.fds)} descriptors cannot ride on {len(data)} bytes")
    del data
    return buf.getvalue(), pickler.fds


def send_part(sock: socket.socket, data: memoryview, fds: Sequence[int]) -> tuple[int, int]:
    """Send the start of ``data``, the first ``MAX_FDS`` of ``fds`` riding on its first
    byte; how many bytes and descriptors went. A non-blocking ``sock`` that has no room
    raises ``BlockingIOError``."""
    if not fds:
        return sock.send(data), 0
    rights = array.array("i", fds[:MAX_FDS]).tobytes()
    sent = sock.sendmsg([data[:1]], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, rights)])
    return sent, min(len(fds), MAX_FDS)


def send_with_fds(sock: socket.socket, data: bytes, fds: Sequence[int]) -> None:
    """Send ``data`` from ``encode_with_fds`` (blocking), ``fds`` riding on its first bytes."""
    view = memoryview(data)
    while view:
        sent, carried = send_part(sock, view, fds)
        view, fds = view[sent:], fds[carried:]


def received_fds(ancdata: list[tuple[int, int, bytes]]) -> list[int]:
    """The descriptors in ``recvmsg``'s ancillary data."""
    fds = array.array("i")
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
    return list(fds)


def encode(kind: str, body: object) -> bytes:
    """One framed message."""
    data = pickle.dumps((kind, body), protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(data)) + data


def send(sock: socket.socket, kind: str, body: object) -> None:
    """Send one message (blocking). Callers that share ``sock`` hold a lock."""
    sock.sendall(encode(kind, body))


def recv(sock: socket.socket) -> Message | None:
    """Receive one message (blocking); None when the peer has closed."""
    header = recv_exact(sock, HEADER.size)
    if header is None:
        return None
    (length,) = HEADER.unpack(header)
    data = recv_exact(sock, length)
    if data is None:
        return None
    kind, body = pickle.loads(data)
    return str(kind), body


def messages(sock: socket.socket) -> Iterator[Message]:
    """Each message arriving on the blocking ``sock``, with its ``Descriptors``;
    ends when the peer closes (or the socket fails)."""
    reader = FrameReader()
    try:
        while True:
            try:
                data, ancdata, _, _ = sock.recvmsg(1 << 16, FD_SPACE, socket.MSG_CMSG_CLOEXEC)
            except OSError:
                return
            if not data:
                return
            yield from reader.feed(data, received_fds(ancdata))
    finally:
        reader.close()


def recv_exact(sock: socket.socket, n: int) -> bytes | None:
    """``n`` bytes from the blocking ``sock``; None when the peer closes first."""
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


class FrameReader:
    """Incremental, non-blocking decoder for the notebook side's event loop.

    Descriptors received beside the bytes (``feed``'s ``fds``) are owned by the reader until a
    message claims them (see module doc); ``close`` closes those never claimed.
    """

    def __init__(self) -> None:
        self._buf = bytearray()
        self._fds: list[int] = []

    def feed(self, data: bytes, fds: Sequence[int] = ()) -> list[Message]:
        """Add received bytes and descriptors; return every message now complete.

        A message claiming more descriptors than arrived (the kernel drops them when the receiver is
        out of file descriptors) gets them as ``missing``."""
        self._fds += fds
        self._buf += data
        out: list[Message] = []
        while len(self._buf) >= HEADER.size:
            (length,) = HEADER.unpack_from(self._buf)
            if length > MAX_FRAME:
                raise ValueError(f"frame of {length} bytes: the channel is corrupt")
            end = HEADER.size + length
            if len(self._buf) < end:
                break
            kind, body = _FrameUnpickler(bytes(self._buf[HEADER.size : end]), self).load()
            del self._buf[:end]
            out.append((str(kind), body))
        return out

    @property
    def pending(self) -> int:
        """Bytes of an incomplete frame still buffered."""
        return len(self._buf)

    def take(self, count: int) -> Descriptors:
        """The next ``count`` received descriptors, owned by the result."""
        got, self._fds = self._fds[:count], self._fds[count:]
        return Descriptors(got, owned=True, missing=count - len(got))

    def close(self) -> None:
        """Close the descriptors no message claimed."""
        Descriptors(self._fds, owned=True).close()
        self._fds = []


class _FrameUnpickler(pickle.Unpickler):
    """Unpickles one message, handing each ``Descriptors`` in it the reader's next fds."""

    def __init__(self, data: bytes, reader: FrameReader) -> None:
        super().__init__(io.BytesIO(data))
        self._reader = reader

    def persistent_load(self, pid: object) -> Descriptors:
        if isinstance(pid, tuple) and len(pid) == 2 and pid[0] == "fds":
            return self._reader.take(int(pid[1]))
        raise pickle.UnpicklingError(f"unknown persistent id {pid!r:.40}")
