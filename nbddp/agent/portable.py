"""What crosses between a node's agent and the notebook: shared memory made plain bytes.

Contract: on one machine a rank's value, its exception, a session rank's
reply and the call's large arguments travel as bytes plus shared-memory descriptors
(``descriptors.Packed``, ``payload.Payload``); descriptors cannot leave a
machine. ``ship_*`` (on the sending side) reads each descriptor's memory
into bytes once; ``land_*`` (on the receiving side) writes them into fresh
shared memory (memfd), so the rest of nbddp gets the very types it gets
locally: ``values.unpack`` and ``failures.run_error`` work unchanged.
A payload holding multiprocessing objects (pipes, queues, locks) cannot be
shipped: ``PayloadError`` says so. Nothing here imports ray.
"""

from __future__ import annotations

import mmap
import os
import pickle
import stat
from dataclasses import dataclass, replace

from nbddp.errors import PayloadError
from nbddp.launcher.events import Failure, RankOutcome
from nbddp.wire.descriptors import Descriptors, OwnedFd, Packed, memfd_with, read_all
from nbddp.wire.payload import Payload
from nbddp.wire.protocol import CellReply, ErrorInfo


def read_fd(fd: int) -> bytes:
    """The whole content of a shared-memory descriptor (a memfd: a regular file)."""
    read_fd_check(fd)
    return read_all(fd, os.fstat(fd).st_size)


def read_fd_check(fd: int) -> None:
    """``PayloadError`` unless ``fd`` is shared memory (a memfd: a regular file)."""
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        raise PayloadError(
            "a multiprocessing object (queue, pipe, lock, event) cannot be sent to ranks "
            "on other machines; create it inside the function, or use torch.distributed"
        )


@dataclass(frozen=True)
class ShippedValue:
    """A ``Packed`` value with its shared memory as bytes."""

    data: bytes
    type_name: str
    memory: tuple[bytes, ...]


def ship_value(packed: Packed) -> ShippedValue:
    """``packed`` made plain bytes (sending side)."""
    return ShippedValue(packed.data, packed.type_name, tuple(read_fd(fd) for fd in packed.fds.fds))


def land_value(shipped: ShippedValue) -> Packed:
    """The ``Packed`` again, on fresh shared memory it owns (receiving side)."""
    fds = [memfd_with(part, "nbddp-landed") for part in shipped.memory]
    return Packed(shipped.data, shipped.type_name, Descriptors(fds, owned=True))


@dataclass(frozen=True)
class ShippedError:
    """An ``ErrorInfo`` whose exception is shipped apart."""

    info: ErrorInfo
    """The error without its packed exception."""
    exc: ShippedValue | None


def ship_error(info: ErrorInfo) -> ShippedError:
    exc = ship_value(info.exc) if info.exc is not None else None
    return ShippedError(replace(info, exc=None), exc)


def land_error(shipped: ShippedError) -> ErrorInfo:
    exc = land_value(shipped.exc) if shipped.exc is not None else None
    return replace(shipped.info, exc=exc)


@dataclass(frozen=True)
class ShippedOutcome:
    """A ``RankOutcome`` with its value and error shipped apart."""

    outcome: RankOutcome
    value: ShippedValue | None
    error: ShippedError | None


def ship_outcome(outcome: RankOutcome, first_rank: int) -> ShippedOutcome:
    """A node's outcome made plain, its rank made global."""
    value = ship_value(outcome.value) if outcome.value is not None else None
    error = ship_error(outcome.error) if outcome.error is not None else None
    plain = replace(outcome, rank=outcome.rank + first_rank, value=None, error=None)
    return ShippedOutcome(plain, value, error)


@dataclass(frozen=True)
class ShippedFailure:
    """A ``Failure`` as a node saw it: ``at`` is ``time.time()`` there."""

    at: float
    failure: Failure
    error: ShippedError | None


def ship_failure(at: float, failure: Failure, first_rank: int) -> ShippedFailure:
    error = ship_error(failure.error) if failure.error is not None else None
    return ShippedFailure(at, replace(failure, rank=failure.rank + first_rank, error=None), error)


@dataclass(frozen=True)
class ShippedReply:
    """A session rank's ``CellReply`` with its value and error shipped apart."""

    reply: CellReply
    value: ShippedValue | None
    error: ShippedError | None


def ship_reply(reply: CellReply) -> ShippedReply:
    value = ship_value(reply.value) if reply.value is not None else None
    error = ship_error(reply.error) if reply.error is not None else None
    return ShippedReply(replace(reply, value=None, error=None), value, error)


def land_reply(shipped: ShippedReply) -> CellReply:
    value = land_value(shipped.value) if shipped.value is not None else None
    error = land_error(shipped.error) if shipped.error is not None else None
    return replace(shipped.reply, value=value, error=error)


ShippedPayload = tuple[bytes, tuple["bytes | pickle.PickleBuffer", ...]]
"""A call's bytes and its shared memory, as ``ship_payload`` hands them to Ray."""


def ship_payload(payload: Payload) -> ShippedPayload:
    """The call's bytes and its shared memory (notebook side).

    Each memory goes as a ``PickleBuffer`` over a read-only map of its descriptor:
    Ray stores such a buffer out of band (one copy, into its object store) and a
    node reads it from there without another copy; plain bytes cost two more
    copies of a large argument."""
    return payload.data, tuple(_mapped(fd) for fd in payload.fds)


def _mapped(fd: int) -> bytes | pickle.PickleBuffer:
    read_fd_check(fd)
    size = os.fstat(fd).st_size
    return pickle.PickleBuffer(mmap.mmap(fd, size, prot=mmap.PROT_READ)) if size else b""


def land_payload(shipped: ShippedPayload) -> Payload:
    """The ``Payload`` again on a node, on shared memory it owns."""
    data, memory = shipped
    fds = tuple(memfd_with(memoryview(part), "nbddp-landed") for part in memory)
    return Payload(data, fds, tuple(OwnedFd(fd) for fd in fds))
