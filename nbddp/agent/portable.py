"""What crosses between a node's agent and the notebook: shared memory made plain bytes.

Contract: on one machine a rank's value, its exception, a session rank's reply and the call's large
arguments travel as bytes plus shared-memory descriptors (``descriptors.Packed``,
``payload.Payload``); descriptors cannot leave a machine. ``ship(obj)`` and ``ship_payload`` (on the
sending side) read each descriptor's memory into bytes once; ``land`` and ``land_payload`` (on the
receiving side) write them into fresh shared memory (memfd), so the rest of nbddp gets the very
objects it gets locally: ``values.unpack`` and ``failures.run_error`` work unchanged. A session's
node keeps the memory it was sent by mark (``shm.Mark``: the same tensor, unchanged) while the
notebook holds that memory, so a cell reading what an earlier one read sends none of it. A payload
holding multiprocessing objects (pipes, queues, locks) cannot be shipped: ``PayloadError`` says so.
Nothing here imports ray.
"""

from __future__ import annotations

import io
import mmap
import os
import pickle
import stat

from nbddp.errors import PayloadError
from nbddp.wire import inplace
from nbddp.wire.descriptors import Descriptors, OwnedFd, memfd_with, read_all
from nbddp.wire.payload import Payload
from nbddp.wire.shm import Mark


def _shared_size(fd: int) -> int:
    """The size of ``fd``'s memory; ``PayloadError`` unless it is shared memory (a memfd:
    a regular file)."""
    status = os.fstat(fd)
    if not stat.S_ISREG(status.st_mode):
        raise PayloadError(
            "a multiprocessing object (queue, pipe, lock, event) cannot be sent to ranks "
            "on other machines; create it inside the function, or use torch.distributed"
        )
    return status.st_size


Shipped = tuple[bytes, tuple[bytes, ...]]
"""An object pickled, and the shared memory its ``Descriptors`` held, as bytes (``ship``)."""


class _Shipper(pickle.Pickler):
    """Pickles an object, reading the memory of every ``Descriptors`` in it into bytes."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.memory: list[bytes] = []

    def persistent_id(self, obj: object) -> tuple[int, int] | None:
        if type(obj) is not Descriptors:
            return None
        self.memory.extend(read_all(fd, _shared_size(fd)) for fd in obj.fds)
        return len(self.memory) - len(obj.fds), len(obj.fds)


class _Lander(pickle.Unpickler):
    """Unpickles a shipped object, each ``Descriptors`` on fresh shared memory it owns."""

    def __init__(self, shipped: Shipped) -> None:
        super().__init__(io.BytesIO(shipped[0]))
        self.memory = shipped[1]

    def persistent_load(self, pid: tuple[int, int]) -> Descriptors:
        start, count = pid
        parts = self.memory[start : start + count]
        return Descriptors([memfd_with(part, "nbddp-landed") for part in parts], owned=True)


def ship(obj: object) -> Shipped:
    """``obj`` (a node's batch: values, errors, replies) made plain bytes (sending side)."""
    buf = io.BytesIO()
    shipper = _Shipper(buf)
    shipper.dump(obj)
    return buf.getvalue(), tuple(shipper.memory)


def land(shipped: Shipped) -> object:
    """The shipped object again, its shared memory fresh (receiving side)."""
    return _Lander(shipped).load()


ShippedPayload = tuple[
    bytes, tuple["bytes | pickle.PickleBuffer | None", ...], dict[int, Mark], frozenset[Mark]
]
"""A call's bytes, its shared memory (None: the node holds it already), the memory's marks and
every mark the nodes are to keep, as ``ship_payload`` hands them to the engine."""


def ship_payload(payload: Payload, held: frozenset[Mark] = frozenset()) -> ShippedPayload:
    """The call's bytes and its shared memory (notebook side) but what the nodes hold (``held``);
    they keep what this call reads and what the notebook still holds unchanged (pass it next).

    Each memory goes as a ``PickleBuffer`` over a read-only map of its descriptor: Ray stores such a
    buffer out of band (one copy, into its object store) and a node reads it from there without
    another copy; plain bytes cost two more copies of a large argument."""
    marks, live = payload.marks, inplace.live()
    memory = tuple(
        None if marks.get(i) in held else _mapped(fd) for i, fd in enumerate(payload.fds)
    )
    newer = {m[:2] for m in marks.values()}  # an older version of it is let go
    keep = {m for m in held if m[:2] in live and m[:2] not in newer}
    return payload.data, memory, marks, frozenset(keep | set(marks.values()))


def _mapped(fd: int) -> bytes | pickle.PickleBuffer:
    size = _shared_size(fd)
    return pickle.PickleBuffer(mmap.mmap(fd, size, prot=mmap.PROT_READ)) if size else b""


def land_payload(shipped: ShippedPayload, kept: dict[Mark, OwnedFd]) -> Payload:
    """The ``Payload`` again on a node, on memory it owns (``kept``: what it holds, by mark)."""
    data, memory, marks, keep = shipped
    owned = [
        kept[marks[i]] if m is None else OwnedFd(memfd_with(memoryview(m), "nbddp-landed"))
        for i, m in enumerate(memory)
    ]
    for gone in set(kept) - keep:
        del kept[gone]
    kept.update((marks[i], owned[i]) for i in marks)
    return Payload(data, tuple(o.fd for o in owned), tuple(owned), marks)
