"""Large notebook buffers shared where they lie: the same address, the same values, no second copy.

Contract: ``share(address, nbytes, owner)`` returns an ``OwnedFd`` of a memfd and the buffer's
offset in it, or None unless the buffer is a glibc block of its own in private anonymous memory. Its
whole pages are swapped, 64 MiB at a time, for memfd pages with the same bytes: its address, values
and views stay, and the notebook never holds more than a chunk twice; the partial pages at its ends
are written at each call. No Python thread runs meanwhile (native code writing those bytes without
the GIL may lose a write). While ``owner`` (None once the buffer is freed or moved) lives it is not
copied again; pages that outlive it (memory it borrowed) turn private again. A forked child maps
the pages copy-on-write.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import mmap
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass

from nbddp.wire.descriptors import OwnedFd

log = logging.getLogger(__name__)

PAGE = mmap.PAGESIZE
CHUNK = 64 << 20  # bytes swapped per step: the most the notebook holds twice
_IS_MMAPPED = 2  # glibc's chunk-header bit for a block mmapped on its own

_libc = ctypes.PyDLL(None, use_errno=True)  # PyDLL: the calls keep the GIL
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, *[ctypes.c_int] * 3, ctypes.c_long]
_libc.pwrite.restype = ctypes.c_ssize_t
_libc.pwrite.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_long]
_MAP_FIXED, _FAILED = 0x10, ctypes.c_void_p(-1).value


@dataclass
class _Shared:
    fd: OwnedFd
    base: int  # the address the memfd's offset 0 stands for (page-aligned)
    nbytes: int
    owner: Callable[[], object]
    done: int  # the end of the pages swapped so far

    def inner(self, address: int) -> tuple[int, int]:
        """The whole pages of the buffer at ``address``."""
        return _round_up(address), (address + self.nbytes) // PAGE * PAGE


_HELD: dict[int, _Shared] = {}  # buffer address -> its memfd
_SWAPPING = threading.Lock()


def share(address: int, nbytes: int, owner: Callable[[], object]) -> tuple[OwnedFd, int] | None:
    """The memfd now holding the buffer's pages and the buffer's offset in it (see module doc);
    None: copy it instead."""
    forget_gone()
    held = _HELD.get(address)
    if held is None or held.nbytes != nbytes:
        inner_lo = _round_up(address)
        if (address + nbytes) // PAGE * PAGE - inner_lo < PAGE or not _own_block(address, nbytes):
            return None
        base = address - address % PAGE
        fd = OwnedFd(os.memfd_create("nbddp-shared", os.MFD_CLOEXEC))
        os.ftruncate(fd.fd, _round_up(address + nbytes) - base)
        held = _HELD[address] = _Shared(fd, base, nbytes, owner, inner_lo)
        if _collected not in gc.callbacks:
            gc.callbacks.append(_collected)
    try:
        _swap(held, address)
    except OSError:
        log.debug("cannot share %d bytes in place; copying them", nbytes, exc_info=True)
        return None  # the pages swapped so far stay shared; the next call goes on
    start = address - held.base
    inner_lo, inner_hi = (x - held.base for x in held.inner(address))
    view = memoryview((ctypes.c_char * nbytes).from_address(address)).cast("B")
    os.pwrite(held.fd.fd, view[: inner_lo - start], start)  # the ends: written each time
    os.pwrite(held.fd.fd, view[inner_hi - start :], inner_hi)
    return held.fd, start


def forget_gone() -> None:
    """Drop the memfds of buffers whose owner is gone. Memory the owner borrowed outlives it:
    its pages become copy-on-write copies of the memfd, private again."""
    for address, held in list(_HELD.items()):
        if held.owner() is None:
            _HELD.pop(address, None)
            _private(held, address)


def live() -> set[tuple[int, int]]:
    """The (device, inode) of each memfd held for a buffer still there."""
    forget_gone()
    return {(s.st_dev, s.st_ino) for s in (os.fstat(h.fd.fd) for h in list(_HELD.values()))}


def _collected(phase: str, info: dict[str, int]) -> None:
    # After each collection: a weak reference's callback would come before the storage is freed.
    if phase == "stop":
        forget_gone()
        if not _HELD and _collected in gc.callbacks:
            gc.callbacks.remove(_collected)


def _round_up(n: int) -> int:
    return -(-n // PAGE) * PAGE


def _own_block(address: int, nbytes: int) -> bool:
    """True if ``[address, address + nbytes)`` is an mmapped block of glibc's own, in private
    anonymous memory (no other data shares its pages; freeing it unmaps them)."""
    if not _anonymous(address - 16, address):
        return False  # no chunk header there to read
    prev_size = ctypes.c_size_t.from_address(address - 16).value
    size = ctypes.c_size_t.from_address(address - 8).value & ~7
    start, end = address - 16 - prev_size, address - 16 + size
    mmapped = ctypes.c_size_t.from_address(address - 8).value & _IS_MMAPPED
    fits = start % PAGE == 0 and end % PAGE == 0 and address + nbytes <= end
    return bool(mmapped and fits and _anonymous(start, end))


def _anonymous(start: int, end: int) -> bool:
    """True if ``[start, end)`` lies in private anonymous memory (one mapping or adjacent ones:
    ``madvise`` splits a block into several)."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if hi <= start:
                continue
            if lo > start or fields[1] != "rw-p" or len(fields) != 5 or fields[4] != "0":
                return False  # a gap, or memory of another kind
            start = hi
            if start >= end:
                return True
    return False


def _swap(held: _Shared, address: int) -> None:
    """Swap the buffer's whole pages not yet swapped for the memfd's, a chunk at a time."""
    inner_hi = held.inner(address)[1]
    rw, fixed = mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED | _MAP_FIXED
    with _SWAPPING:  # (two threads would each restore the other's switch interval)
        interval = sys.getswitchinterval()
        sys.setswitchinterval(1e6)  # no other Python thread runs until every chunk is swapped
        try:
            while held.done < inner_hi:
                lo, size = held.done, min(CHUNK, inner_hi - held.done)
                # pwrite, not a copy into a mapping: no page fault (and zeroing) per page.
                if _libc.pwrite(held.fd.fd, lo, size, lo - held.base) != size:
                    raise OSError(ctypes.get_errno(), "writing to shared memory failed")
                if _libc.mmap(lo, size, rw, fixed, held.fd.fd, lo - held.base) == _FAILED:
                    raise OSError(ctypes.get_errno(), "mmap of shared memory over it failed")
                held.done = lo + size
        finally:
            sys.setswitchinterval(interval)


def _private(held: _Shared, address: int) -> None:
    """Map the swapped pages copy-on-write if still the memfd's (freed, they may hold others)."""
    lo, inode = held.inner(address)[0], str(os.fstat(held.fd.fd).st_ino)
    with open("/proc/self/maps") as maps:
        spans = [(f[0].split("-"), f[4]) for f in map(str.split, maps)]
    if held.done > lo and any(int(a, 16) <= lo < int(b, 16) and n == inode for (a, b), n in spans):
        rw, private = mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | _MAP_FIXED
        _libc.mmap(lo, held.done - lo, rw, private, held.fd.fd, lo - held.base)


def _private_in_child() -> None:
    """In a forked child: shared pages copy-on-write, as fork makes private memory; a new lock."""
    global _SWAPPING
    _SWAPPING = threading.Lock()
    for address, held in list(_HELD.items()):
        _private(held, address)


os.register_at_fork(after_in_child=_private_in_child)
