"""Large tensors in the payload travel through shared memory, not pickled bytes.

``dumps(obj)`` pickles like cloudpickle, but puts the memory of each plain CPU tensor's storage
and contiguous numpy array of at least ``SHARE_BYTES`` in shared memory: its own if torch shared
it already, else shared where it lies (``inplace``), else a copy; never moved, so every view
stays valid. It returns the bytes and those fds. ``loads(data, fds)`` maps them copy-on-write,
so a rank's writes stay its own; the results' pickler (``values``) copies, and the notebook maps
them shared (``shared=True``). Non-goals: CUDA, sparse or quantized tensors, non-contiguous or
object arrays, numpy subclasses (all pickled as usual).
"""

from __future__ import annotations

import ctypes
import functools
import io
import mmap
import os
import pickle
import sys
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, TypeGuard

from nbddp.wire import inplace
from nbddp.wire.cloud import CloudPickler
from nbddp.wire.descriptors import Descriptors, OwnedFd, memfd_with

if TYPE_CHECKING:
    from _pickle import _ReducedType

    import numpy as np
    import torch

SHARE_BYTES = 1 << 20

Mark = tuple[int, int, int]
"""What a lasting descriptor holds: its file (device, inode) and the tensor's ``_version``, which
every in-place write to it (through the tensor or its views) increments."""
_Owner = Callable[[], object]  # a weak reference to what owns a buffer (``inplace.share``)
_Reduced = tuple[Callable[..., object], tuple[object, ...]]  # a rebuild function and its arguments


class SharingPickler(CloudPickler):
    """The pickler ``dumps`` uses (also for return values: ``values``)."""

    def __init__(self, file: io.BytesIO, extra: Callable[[object], _Reduced | None] | None) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._extra = extra  # the caller's reductions, tried first
        self.fds: list[int] = []
        self.owned: list[OwnedFd] = []  # memfds made here, closed when the payload goes
        self.keep: list[object] = []  # what other descriptors in ``fds`` belong to
        self._index: dict[int, tuple[int, int]] = {}  # storage address -> (position, offset)
        self.marks: dict[int, Mark] = {}
        """Position in ``fds`` -> what a lasting one holds (``Mark``): a tensor's memory."""
        self._copies: set[int] = set()  # fds of copies made for this pickle alone
        self._arrays: dict[int, tuple[int, int, np.ndarray]] = {}  # id -> (position, offset, it)

    def reducer_override(self, obj: object) -> _ReducedType:
        reduced = self._extra(obj) if self._extra is not None else None
        if reduced is not None:
            return reduced
        if _plain_tensor(obj) and _shareable(obj):
            return self._reduce_tensor(obj)
        if _plain_array(obj) and _array_shareable(obj):
            return self._reduce_array(obj)
        if type(obj) is Descriptors:
            self.keep.append(obj)
            start = len(self.fds)
            self.fds.extend(obj.fds)
            return _rebuild_descriptors, (start, len(obj.fds))
        return super().reducer_override(obj)

    def _share(self, storage: torch.UntypedStorage) -> tuple[int, int]:
        """A descriptor of shared memory holding ``storage``'s bytes, and their offset in it:
        its own if already shared, else shared in place (``inplace``) or copied."""
        fd = self._shared_fd(storage)
        if fd is not None:
            return fd, 0
        owner = None if _pinned(storage) else _weak(storage)
        return self._buffer(storage.data_ptr(), storage.nbytes(), owner)

    def _shared_fd(self, storage: torch.UntypedStorage) -> int | None:
        """The descriptor of a storage already in torch's shared memory, kept while sent."""
        if storage.is_shared():
            fd, _ = storage._share_fd_cpu_()  # as torch's own multiprocessing reductions get it
            if int(fd) >= 0:  # a storage mapped from a file has none
                self.keep.append(storage)
                return int(fd)
        return None

    def _buffer(self, address: int, nbytes: int, owner: _Owner | None) -> tuple[int, int]:
        """A descriptor holding the ``nbytes`` at ``address``, and their offset in it: shared in
        place if ``owner`` says who owns them (``inplace.share``) and it can be, else copied."""
        found = inplace.share(address, nbytes, owner) if owner is not None else None
        if found is None:
            view = memoryview((ctypes.c_char * nbytes).from_address(address))
            found = OwnedFd(memfd_with(view, "nbddp-copy")), 0
            self._copies.add(found[0].fd)
        self.owned.append(found[0])
        return found[0].fd, found[1]

    def _reduce_array(self, array: np.ndarray) -> _Reduced:
        # Shared in place where it can be, else copied once for all ranks
        # (pickling would copy it once per rank, and again when unpickling).
        key = id(array)
        if key not in self._arrays:
            fd, start = self._buffer(array.ctypes.data, array.nbytes, _weak_array(array))
            self._arrays[key] = (len(self.fds), start, array)  # the array kept: ids stay unique
            self.fds.append(fd)
        index, start, _ = self._arrays[key]
        meta = (index, start, array.nbytes, array.dtype, array.shape, _order(array))
        return _rebuild_array, meta

    def _reduce_tensor(self, tensor: torch.Tensor) -> _Reduced:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in self._index:
            fd, start = self._share(storage)
            self._index[storage.data_ptr()] = (len(self.fds), start)
            if fd not in self._copies:
                status = os.fstat(fd)
                self.marks[len(self.fds)] = (status.st_dev, status.st_ino, tensor._version)
            self.fds.append(fd)
        index, start = self._index[storage.data_ptr()]
        meta = (
            index,
            start,
            storage.nbytes(),
            tensor.dtype,
            tensor.storage_offset(),
            tuple(tensor.size()),
            tuple(tensor.stride()),
            tensor.requires_grad,
        )
        return _rebuild_tensor, meta


def _plain_tensor(obj: object) -> TypeGuard[torch.Tensor]:
    # getattr: torch may be half-imported (nbddp's background prewarm); a
    # tensor can only exist once torch has been fully imported.
    return type(obj) is getattr(sys.modules.get("torch"), "Tensor", None)


def _plain_array(obj: object) -> TypeGuard[np.ndarray]:
    return type(obj) is getattr(sys.modules.get("numpy"), "ndarray", None)


def _order(array: np.ndarray) -> Literal["C", "F"]:
    return "C" if array.flags.c_contiguous else "F"


def _array_shareable(array: np.ndarray) -> bool:
    return bool(
        array.nbytes >= SHARE_BYTES
        and not array.dtype.hasobject
        and (array.flags.c_contiguous or array.flags.f_contiguous)
    )


def _weak(storage: torch.UntypedStorage) -> _Owner:
    """A weak reference to ``storage`` at its address now: None once it is freed or its
    memory has moved (``resize_``)."""
    import torch
    from torch.multiprocessing.reductions import StorageWeakRef

    ref, address = StorageWeakRef(storage), storage.data_ptr()  # type: ignore[no-untyped-call]

    def owner() -> object:
        if ref.expired():  # type: ignore[no-untyped-call]
            return None
        alive = torch.UntypedStorage._new_with_weak_ptr(ref.cdata)
        return alive if alive.data_ptr() == address else None

    return owner


def _weak_array(array: np.ndarray) -> _Owner:
    """As ``_weak``, for an array (``resize`` moves its memory)."""
    ref, address = weakref.ref(array), array.ctypes.data

    def owner() -> object:
        alive = ref()
        return alive if alive is not None and alive.ctypes.data == address else None

    return owner


def _pinned(storage: torch.UntypedStorage) -> bool:
    # Pinned memory needs CUDA started; asking before could start it in the notebook.
    cuda = sys.modules.get("torch.cuda")
    return bool(cuda is not None and cuda.is_initialized() and storage.is_pinned())


def _shareable(tensor: torch.Tensor) -> bool:
    import torch  # imported: there is a tensor

    return bool(
        tensor.device.type == "cpu"
        and tensor.layout == torch.strided
        and not tensor.is_quantized
        and (tensor.grad_fn is None)
        and tensor.untyped_storage().nbytes() >= SHARE_BYTES
    )


def dumps(
    obj: object, extra: Callable[[object], _Reduced | None] | None = None
) -> tuple[bytes, list[int], list[OwnedFd], dict[int, Mark]]:
    """Pickle ``obj``; large tensors and arrays become shared-memory descriptors (see module doc).
    The third item owns the descriptors made here: keep it as long as they are needed; the fourth
    marks the lasting ones (``SharingPickler.marks``). ``extra``: the caller's own reductions, tried
    first on every object (None: pickle it as usual)."""
    buf = io.BytesIO()
    pickler = SharingPickler(buf, extra)
    pickler.dump(obj)
    return buf.getvalue(), pickler.fds, pickler.owned, pickler.marks


def loads(data: bytes, fds: Sequence[int], *, shared: bool = False) -> object:
    """Unpickle in a rank, mapping the descriptors ``fds`` copy-on-write; ``shared``: map them
    shared (results: the sender is done with them), tensors as torch shared-memory storages."""
    return _MappingUnpickler(data, fds, shared).load()


class _MappingUnpickler(pickle.Unpickler):
    """Unpickles a payload whose shared-memory references index ``fds``.

    The rebuild functions are named in the pickle by reference; this unpickler
    hands out each one bound to its own ``fds`` and mapping, so the received
    descriptors are this unpickler's state, not the module's.
    """

    def __init__(self, data: bytes, fds: Sequence[int], shared: bool) -> None:
        super().__init__(io.BytesIO(data))
        self._fds = _Received(tuple(fds), shared)

    def find_class(self, module_name: str, global_name: str, /) -> object:
        rebuild = _REBUILDERS.get(global_name) if module_name == __name__ else None
        if rebuild is not None:
            return functools.partial(rebuild, self._fds)
        return super().find_class(module_name, global_name)


@dataclass(frozen=True)
class _Received:
    """The descriptors a pickle refers to, and how to map them: copy-on-write (a
    payload, in a rank) or shared (a result, whose sender is done with it)."""

    fds: tuple[int, ...]
    shared: bool

    def region(self, index: int, nbytes: int) -> mmap.mmap:
        flags = mmap.MAP_SHARED if self.shared else mmap.MAP_PRIVATE
        return mmap.mmap(self.fds[index], nbytes, flags=flags)


def _rebuild_tensor(
    got: _Received,
    index: int,
    start: int,
    nbytes: int,
    dtype: torch.dtype,
    offset: int,
    size: tuple[int, ...],
    stride: tuple[int, ...],
    requires_grad: bool,
) -> torch.Tensor:
    import torch

    if got.shared:
        # A torch shared-memory storage (MAP_SHARED, keeping a duplicate of the
        # descriptor): ``is_shared()``, so a later launch sends it without a copy.
        new_shared = torch.UntypedStorage._new_shared_fd_cpu  # type: ignore[attr-defined]
        storage = new_shared(got.fds[index], nbytes)  # (missing from torch's stubs)
    else:
        region = got.region(index, start + nbytes)
        storage = torch.frombuffer(region, dtype=torch.uint8, count=nbytes, offset=start)
        storage = storage.untyped_storage()
    tensor = torch.empty(0, dtype=dtype).set_(storage, offset, size, stride)
    return tensor.requires_grad_(requires_grad)


def _rebuild_array(
    got: _Received,
    index: int,
    start: int,
    nbytes: int,
    dtype: np.dtype[np.generic],
    shape: tuple[int, ...],
    order: Literal["C", "F"],
) -> np.ndarray:
    import numpy as np

    region = got.region(index, start + nbytes)
    return np.frombuffer(region, dtype=dtype, offset=start).reshape(shape, order=order)


def _rebuild_descriptors(got: _Received, start: int, count: int) -> Descriptors:
    return Descriptors([os.dup(fd) for fd in got.fds[start : start + count]], owned=True)


_REBUILDERS: dict[str, Callable[..., object]] = {
    "_rebuild_tensor": _rebuild_tensor,
    "_rebuild_array": _rebuild_array,
    "_rebuild_descriptors": _rebuild_descriptors,
}
"""What ``_MappingUnpickler`` binds to the received descriptors, by the name the pickle uses."""
