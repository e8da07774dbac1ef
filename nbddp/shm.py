"""Large tensors in the payload travel through shared memory, not pickled bytes.

Contract: ``dumps(obj)`` pickles like cloudpickle, except that every plain
CPU tensor of at least ``SHARE_BYTES`` is moved to shared memory in place
(as ``share_memory_()`` does when torch.multiprocessing sends a tensor:
every view of it stays valid; ``shm_move`` does it for large tensors
without holding two full copies) and pickled as a reference to a file
descriptor; it returns the bytes and those descriptors. The notebook sends
the descriptors to each rank with its order (SCM_RIGHTS on the rank's
socketpair); ``loads(data, fds)`` in the rank maps them copy-on-write
(``MAP_PRIVATE``): the ranks and the notebook share the pages, and a rank
that writes to its tensor changes only its own copy, as with fork.

Non-goals: CUDA tensors (they are pickled as usual, through the CPU),
sparse/quantized tensors and numpy arrays (pickled as usual).
"""

from __future__ import annotations

import io
import mmap
import sys
from typing import Any

import cloudpickle

from .shm_move import move_to_shared

SHARE_BYTES = 1 << 20

_RECEIVED: list[int] = []  # the rank's received descriptors, while its payload is unpickled


class _SharingPickler(cloudpickle.Pickler):  # type: ignore[misc]
    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file)
        self.fds: list[int] = []
        self._index: dict[int, int] = {}  # storage address -> position in fds

    def reducer_override(self, obj: Any) -> Any:
        # getattr: torch may be half-imported (nbddp's background prewarm); a
        # tensor can only exist once torch has been fully imported.
        torch = sys.modules.get("torch")
        tensor = getattr(torch, "Tensor", None)
        if tensor is not None and type(obj) is tensor and _shareable(torch, obj):
            return self._reduce_tensor(obj)
        return super().reducer_override(obj)

    def _reduce_tensor(self, tensor: Any) -> Any:
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key not in self._index:
            move_to_shared(storage)  # no-op when already shared (repeat launches)
            # torch's own multiprocessing reductions get the fd this way.
            fd, _ = storage._share_fd_cpu_()
            self._index[storage.data_ptr()] = len(self.fds)
            self.fds.append(fd)
            key = storage.data_ptr()
        meta = (
            self._index[key],
            storage.nbytes(),
            tensor.dtype,
            tensor.storage_offset(),
            tuple(tensor.size()),
            tuple(tensor.stride()),
            tensor.requires_grad,
        )
        return _rebuild_tensor, meta


def _shareable(torch: Any, tensor: Any) -> bool:
    return bool(
        tensor.device.type == "cpu"
        and tensor.layout == torch.strided
        and not tensor.is_quantized
        and (tensor.grad_fn is None)
        and tensor.untyped_storage().nbytes() >= SHARE_BYTES
    )


def dumps(obj: Any) -> tuple[bytes, list[int]]:
    """Pickle ``obj``; large tensors become shared-memory descriptors (see module doc)."""
    buf = io.BytesIO()
    pickler = _SharingPickler(buf)
    pickler.dump(obj)
    return buf.getvalue(), pickler.fds


def loads(data: bytes, fds: list[int]) -> Any:
    """Unpickle in a rank, mapping the descriptors ``fds`` copy-on-write."""
    _RECEIVED[:] = fds
    try:
        return cloudpickle.loads(data)
    finally:
        _RECEIVED.clear()


def _rebuild_tensor(
    index: int,
    nbytes: int,
    dtype: Any,
    offset: int,
    size: tuple[int, ...],
    stride: tuple[int, ...],
    requires_grad: bool,
) -> Any:
    import torch

    region = mmap.mmap(_RECEIVED[index], nbytes, flags=mmap.MAP_PRIVATE)
    base = torch.frombuffer(region, dtype=torch.uint8)
    tensor = torch.empty(0, dtype=dtype).set_(base.untyped_storage(), offset, size, stride)
    return tensor.requires_grad_(requires_grad)
