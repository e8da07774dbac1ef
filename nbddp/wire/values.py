"""A rank's value on its way to the notebook: small bytes, large data in shared memory.

Contract: ``pack(value)`` (in the rank) pickles ``value`` with cloudpickle,
every tensor not on the CPU copied to the CPU (``tocpu``), and every CPU
tensor storage and numpy array of at least ``shm.SHARE_BYTES`` placed in
shared memory (memfd) instead of in the bytes; it returns a ``Packed``: the
bytes, the value's type name, and the descriptors (``descriptors.Descriptors``)
that travel beside the message carrying it. Each large piece of data is
copied once at most: a storage already in shared memory is sent as it is,
any other storage or array is copied into fresh shared memory (never moved
in place: the rank's own tensors, and numpy arrays viewing them, stay
valid), and a GPU tensor is copied from the device straight into shared
memory. ``unpack(packed)`` (in the notebook) rebuilds the value on those
very pages, mapped shared: no copy, and writing to the value does not
double it (the rank has finished with them). Its tensors are torch
shared-memory storages, as torch.multiprocessing's are, each keeping one
descriptor open while it lives; one that goes into another launch is
shared again without a copy. ``unpack`` closes the received descriptors,
whether the value could be rebuilt or not. ``trial(packed)`` (in the rank)
rebuilds it there, to learn whether it will rebuild at all, without taking
the descriptors from the message.

A rank's exception travels the same way (``protocol.ErrorInfo.exc``): a
large tensor it carries (the batch that broke a step) crosses in shared
memory too, never through the control socket.

Non-goals: large ``bytes`` or Python containers of many small objects go in
the bytes, at the speed of the socket.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

from nbddp.wire import shm, tocpu
from nbddp.wire.descriptors import Descriptors, Packed

if TYPE_CHECKING:
    from _pickle import _ReducedType

    import torch


class _ValuePickler(shm.SharingPickler):
    """The payload's sharing pickler, with GPU tensors copied to the CPU and
    CPU storages copied, not moved, into shared memory."""

    def reducer_override(self, obj: object) -> _ReducedType:
        reduced = tocpu.cpu_reduction(obj, shared_from=shm.SHARE_BYTES)
        return reduced if reduced is not None else super().reducer_override(obj)

    def _share(self, storage: torch.UntypedStorage) -> int:
        if storage.is_shared():
            fd, _ = storage._share_fd_cpu_()
            if int(fd) >= 0:  # a storage mapped from a file has none
                self.keep.append(storage)
                return int(fd)
        import torch

        copy = torch.UntypedStorage._new_using_fd_cpu(storage.nbytes())
        copy.copy_(storage)
        self.keep.append(copy)  # its descriptor lives as long as it does
        fd, _ = copy._share_fd_cpu_()
        return int(fd)


def pack(value: object) -> Packed:
    """``value`` ready to send to the notebook (see module contract)."""
    buf = io.BytesIO()
    pickler = _ValuePickler(buf, None)
    pickler.dump(value)
    fds = Descriptors(pickler.fds, keep=[*pickler.owned, *pickler.keep])
    return Packed(buf.getvalue(), type_name(value), fds)


def unpack(packed: Packed) -> Any:
    """The value, rebuilt on the shared memory it came with (see module contract)."""
    try:
        if packed.fds.missing:
            raise OSError(
                f"{packed.fds.missing} of its {len(packed.fds)} shared-memory descriptors "
                "did not arrive; raise the notebook's open-file limit (ulimit -n)"
            )
        return shm.loads(packed.data, packed.fds.fds, shared=True)
    finally:
        packed.fds.close()


def trial(packed: Packed) -> Any:
    """``packed`` rebuilt where it was packed, on private mappings (see module contract)."""
    return shm.loads(packed.data, packed.fds.fds)


def type_name(value: object) -> str:
    """``module.Qualname`` of ``value``'s type (just the name for builtins)."""
    cls = type(value)
    module = getattr(cls, "__module__", "builtins")
    return cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}"
