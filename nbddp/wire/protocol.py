"""Messages between the notebook and a worker, over a private socketpair.

Contract: a message is ``(kind, body)`` pickled and framed with an 8-byte
length. The socketpair is created by the notebook and inherited by exactly
one worker, so the only peer that can write to it is that worker: there is
no address anyone else could connect to (see DESIGN.md, Safety).

Kinds, worker -> notebook: ``started`` (pid), ``result`` (cloudpickled
value), ``error`` (``ErrorInfo``), ``metrics`` (a list of metric rows,
dicts, in logging order), ``exit`` (code a rank asked for with
``sys.exit``), ``stacks`` (the text of the rank's Python stacks, asked for).
Notebook -> worker: ``run`` (``RunOrder``), then ``stacks`` (None) at any time.
"""

from __future__ import annotations

import pickle
import signal
import socket
import struct
from dataclasses import dataclass
from typing import Any, Literal

HEADER = struct.Struct("!Q")
MAX_FRAME = 1 << 40

# The signal that makes faulthandler dump a rank's stacks from C, for a rank
# that cannot answer ``stacks`` (a thread holds the GIL). Why a real-time
# signal, not SIGUSR1: user code claims SIGUSR1 for itself (checkpoint on
# signal) and would take ours; Linux's top real-time signals are seldom used.
_RTMAX = getattr(signal, "SIGRTMAX", None)
STACKS_SIGNAL = int(_RTMAX) - 3 if _RTMAX is not None else int(signal.SIGUSR1)

DeviceKind = Literal["cuda", "cpu", "inherit"]
Backend = Literal["nccl", "gloo"]


@dataclass(frozen=True)
class Placement:
    """Where a rank sits in its run. In the rank, the worker installs it as the
    rank's context (``nbddp.rank.context``)."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    device: DeviceKind
    """cuda: one GPU, ``cuda_index``; cpu: GPUs hidden; inherit: the notebook's GPUs
    are visible and the rank's code chooses (``spawn()``)."""
    cuda_index: int | None = None
    """The CUDA device the rank uses (among those it sees); None unless ``device`` is cuda."""


@dataclass(frozen=True)
class RunOrder:
    """What a worker needs to run its rank: every value typed; ``env`` is for the user's code."""

    place: Placement
    env: dict[str, str]
    """The rank's whole environment (``RANK``, ``MASTER_PORT``...), set before the call."""
    payload: bytes
    sys_path: list[str]
    cwd: str
    backend: Backend
    init_process_group: bool
    """Initialise the default process group (``backend``) before the call."""
    threads: int | None = None
    """``torch.set_num_threads`` for a rank whose torch was imported before its
    environment was set (forkserver, fork); None leaves torch's own choice."""
    fd_count: int = 0
    """Shared-memory descriptors sent right after the order (SCM_RIGHTS)."""


@dataclass(frozen=True)
class ErrorInfo:
    """A rank's exception, in a form that always crosses the process boundary."""

    type_name: str
    message: str
    traceback: str
    exc_bytes: bytes | None  # the exception itself, when it survives a pickle round trip


def encode(kind: str, body: object) -> bytes:
    """One framed message."""
    data = pickle.dumps((kind, body), protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(data)) + data


def send(sock: socket.socket, kind: str, body: object) -> None:
    """Send one message (blocking). Callers that share ``sock`` hold a lock."""
    sock.sendall(encode(kind, body))


def recv(sock: socket.socket) -> tuple[str, Any] | None:
    """Receive one message (blocking); None when the peer has closed."""
    header = _recv_exact(sock, HEADER.size)
    if header is None:
        return None
    (length,) = HEADER.unpack(header)
    data = _recv_exact(sock, length)
    if data is None:
        return None
    kind, body = pickle.loads(data)
    return str(kind), body


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


class FrameReader:
    """Incremental, non-blocking decoder for the notebook side's event loop."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[str, Any]]:
        """Add received bytes; return every message now complete."""
        self._buf += data
        out: list[tuple[str, Any]] = []
        while len(self._buf) >= HEADER.size:
            (length,) = HEADER.unpack_from(self._buf)
            if length > MAX_FRAME:
                raise ValueError(f"frame of {length} bytes: the channel is corrupt")
            end = HEADER.size + length
            if len(self._buf) < end:
                break
            kind, body = pickle.loads(bytes(self._buf[HEADER.size : end]))
            del self._buf[:end]
            out.append((str(kind), body))
        return out

    @property
    def pending(self) -> int:
        """Bytes of an incomplete frame still buffered."""
        return len(self._buf)
