"""Moving a large CPU storage into shared memory without holding two full copies.

Contract: ``move_to_shared(storage)`` leaves ``storage`` backed by a
shared-memory file (``storage.is_shared()``), with the same bytes, and
every tensor and view on it still valid (torch swaps the data pointer of
the one storage they all share, as ``share_memory_()`` does). Peak memory
stays about one copy plus ``CHUNK``: the bytes are copied a chunk at a time
and each chunk's source pages are handed back to the kernel as soon as they
are copied (``madvise(MADV_DONTNEED)``). ``share_memory_()`` instead holds
both full copies until it is done, which is 2x the tensor for a moment.

The chunked move is used only where it is safe: storages that torch's own
allocator owns (``resizable()``; not memory borrowed from numpy or a file)
of at least ``MOVE_BYTES``, lying entirely in anonymous private memory, and
only pages wholly inside the storage's bytes are released. Everything else
goes through ``share_memory_()``. While a move is under way (about a second
per GiB), another thread reading the tensor would see zeros where the copy
has passed; if the move is interrupted, the copied part is put back first.
Like ``share_memory_()``, it invalidates raw pointers into the old memory
(e.g. ``tensor.numpy()`` arrays made before the launch).
"""

from __future__ import annotations

import ctypes
import mmap
from typing import Any

CHUNK = 64 << 20
MOVE_BYTES = 64 << 20
MADV_DONTNEED = 4
_PAGE = mmap.PAGESIZE
_libc = ctypes.CDLL(None, use_errno=True)
_libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)


def move_to_shared(storage: Any) -> None:
    """Back ``storage`` by shared memory, keeping peak memory near one copy (see module doc)."""
    if storage.is_shared():
        return
    nbytes = int(storage.nbytes())
    if nbytes < MOVE_BYTES or not storage.resizable() or not anonymous(storage.data_ptr(), nbytes):
        storage.share_memory_()
        return
    import torch

    shared = torch.UntypedStorage._new_using_fd_cpu(nbytes)
    src = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (nbytes,), (1,))
    dst = torch.empty(0, dtype=torch.uint8).set_(shared, 0, (nbytes,), (1,))
    base = int(storage.data_ptr())
    done = 0
    try:
        while done < nbytes:
            end = min(nbytes, done + CHUNK)
            dst[done:end].copy_(src[done:end])
            start, done = done, end  # before the release: a restore must cover it
            release(base + start, base + end)
    except BaseException:
        # Interrupted (KeyboardInterrupt): put back what was released. One
        # torch call: no Python bytecode boundary for a second interrupt.
        src[:done].copy_(dst[:done])
        raise
    storage._swap_data_ptr_(shared)  # every view now sees the shared copy


def release(start: int, end: int) -> None:
    """Hand the pages wholly inside [start, end) back to the kernel (they read as zeros)."""
    lo = -(-start // _PAGE) * _PAGE
    hi = end // _PAGE * _PAGE
    if hi > lo and _libc.madvise(lo, hi - lo, MADV_DONTNEED) != 0:
        raise OSError(ctypes.get_errno(), "madvise(MADV_DONTNEED) failed")


def anonymous(address: int, nbytes: int, maps: str = "/proc/self/maps") -> bool:
    """True if [address, address + nbytes) lies wholly in anonymous private read-write memory.

    Only there does MADV_DONTNEED simply free pages; on a private file
    mapping it would bring back the file's bytes.
    """
    end = address + nbytes
    covered = address
    try:
        with open(maps) as f:
            for line in f:
                fields = line.split(maxsplit=5)
                lo, hi = (int(x, 16) for x in fields[0].split("-"))
                if hi <= covered or lo > covered:
                    continue
                path = fields[5].strip() if len(fields) > 5 else ""
                if not fields[1].startswith("rw") or fields[1][3] != "p":
                    return False
                if path not in ("", "[heap]"):
                    return False
                covered = hi
                if covered >= end:
                    return True
    except OSError:
        return False
    return False
