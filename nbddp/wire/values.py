"""A rank's value on its way to the notebook: small bytes, large data in shared memory.

``pack(value)`` (rank) pickles it with every tensor on the CPU (``tocpu``) and each storage or
numpy array of at least ``shm.SHARE_BYTES`` in shared memory, copied at most once and never moved
(the rank's tensors stay valid): a ``Packed``. ``unpack(packed)`` (notebook) rebuilds it on those
pages mapped shared, without a copy, and always closes the received fds. A rank's exception
travels the same way.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

from nbddp.wire import shm, tocpu
from nbddp.wire.descriptors import Descriptors, Packed

if TYPE_CHECKING:
    from _pickle import _ReducedType

    import torch


class _ValuePickler(shm.SharingPickler):
    """The payload's sharing pickler, with GPU tensors copied to the CPU and
    CPU storages copied, not moved, into shared memory."""

    def reducer_override(self, obj: object) -> _ReducedType:
        reduced = tocpu.cpu_reduction(obj, shm.SHARE_BYTES)
        return reduced if reduced is not None else super().reducer_override(obj)

    def _share(self, storage: torch.UntypedStorage) -> tuple[int, int]:
        fd = self._shared_fd(storage)
        address, nbytes = storage.data_ptr(), storage.nbytes()
        return (fd, 0) if fd is not None else self._buffer(address, nbytes, None)


def pack(value: object) -> Packed:
    """``value`` ready to send to the notebook."""
    buf = io.BytesIO()
    pickler = _ValuePickler(buf, None)
    pickler.dump(value)
    fds = Descriptors(pickler.fds, keep=[*pickler.owned, *pickler.keep])
    return Packed(buf.getvalue(), type_name(value), fds)


def unpack(packed: Packed) -> object:
    """The value, rebuilt on the shared memory it came with."""
    try:
        if packed.fds.missing:
            raise OSError(
                f"{packed.fds.missing} of its {len(packed.fds)} shared-memory descriptors "
                "did not arrive; raise the notebook's open-file limit (ulimit -n)"
            )
        return shm.loads(packed.data, packed.fds.fds, shared=True)
    finally:
        packed.fds.close()


def type_name(value: object) -> str:
    """``module.Qualname`` of ``value``'s type (just the name for builtins)."""
    cls = type(value)
    module = getattr(cls, "__module__", "builtins")
    return cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}"
