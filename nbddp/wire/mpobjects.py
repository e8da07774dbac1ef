"""multiprocessing objects in the payload: queues, pipes, locks, events, shared values.

While ``sending(inherits)`` is active on a thread, ``reduce`` (``shm.dumps``'s extra reducer)
sends what multiprocessing shares with a child it starts: connections and ``Value``/``Array``
arenas as fds, semaphores by name (or, unnamed in the ``fork`` context, as fds from
``/proc/self/map_files``, else only to forked ranks; ``MpObjectError`` says what to do), queues
and manager proxies through their own pickling. Their fds follow the shared-memory ones, reversed
(the k-th sent is ``fds[-1 - k]``); in the rank ``receiving(fds)`` resolves them on duplicates.
``flush()`` pushes what a rank put on a ``Queue`` into its pipe. Non-goals: ``Pool``, ``Process``.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import mmap
import os
import sys
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Protocol, cast

from nbddp.wire.descriptors import OwnedFd

if TYPE_CHECKING:
    from multiprocessing import synchronize

Reduced = tuple[Callable[..., object], tuple[object, ...]]


class _Restorable(Protocol):
    """An object made with ``object.__new__``, then given its pickled state."""

    def __setstate__(self, state: tuple[object, ...], /) -> None: ...


class _Queue(_Restorable, Protocol):
    def close(self) -> None: ...
    def join_thread(self) -> None: ...


class MpObjectError(RuntimeError):
    """A multiprocessing object that cannot reach the ranks of this launch."""


class SentFd:
    """The ``index``-th descriptor a payload sent; ``detach()`` in the rank gives a
    duplicate of it, owned by the caller."""

    def __init__(self, index: int) -> None:
        self.index = index

    def detach(self) -> int:
        """A new descriptor for the one received (only while ``receiving``)."""
        fds = _RECEIVED.get()
        if fds is None or self.index >= len(fds):
            raise MpObjectError("a multiprocessing object was unpickled outside its payload")
        return os.dup(fds[-1 - self.index])


class Sending:
    """The descriptors one payload sends for its multiprocessing objects.

    Also the "spawning popen" multiprocessing asks for while pickling them
    (``duplicate_for_child``, ``DupFd``).
    """

    def __init__(self, inherits: bool) -> None:
        self.inherits = inherits
        """The ranks are forked from this process (start method fork)."""
        self.fds: list[int] = []
        """The descriptors to send, in order."""
        self.owned: list[object] = []
        """What keeps them open: their objects, or the duplicates made here."""

    def send(self, fd: int, owner: object) -> SentFd:
        """Send ``fd``, which stays open as long as ``owner`` lives."""
        self.fds.append(fd)
        self.owned.append(owner)
        return SentFd(len(self.fds) - 1)

    def duplicate_for_child(self, fd: int) -> int:
        """Send a duplicate of ``fd``; its index among those sent."""
        dup = os.dup(fd)
        return self.send(dup, OwnedFd(dup)).index

    DupFd = SentFd  # multiprocessing's name for what a rank turns back into a descriptor


_SENDING: contextvars.ContextVar[Sending | None] = contextvars.ContextVar(
    "nbddp_mp_sending", default=None
)
_RECEIVED: contextvars.ContextVar[tuple[int, ...] | None] = contextvars.ContextVar(
    "nbddp_mp_received", default=None
)
_QUEUES: weakref.WeakSet[_Queue] = weakref.WeakSet()  # queues rebuilt in this rank
_SEMAPHORE_FILES: dict[int, tuple[int, int, int]] = {}  # address -> _mapping_of, per lock
_MAPPINGS: list[mmap.mmap] = []  # semaphore memory mapped in this rank: lives as long as it


@contextlib.contextmanager
def sending(inherits: bool) -> Iterator[Sending]:
    """Pickle multiprocessing objects for ranks inside this block."""
    from multiprocessing import context

    sent = Sending(inherits)
    token = _SENDING.set(sent)
    previous = context.get_spawning_popen()
    context.set_spawning_popen(sent)  # type: ignore[arg-type]  # it has what is asked of one
    try:
        yield sent
    finally:
        context.set_spawning_popen(previous)
        _SENDING.reset(token)


@contextlib.contextmanager
def receiving(fds: Sequence[int]) -> Iterator[None]:
    """Resolve the descriptors of multiprocessing objects unpickled in this block."""
    token = _RECEIVED.set(tuple(fds))
    try:
        yield
    finally:
        _RECEIVED.reset(token)


def reduce(obj: object) -> Reduced | None:
    """How a payload pickles ``obj`` when it is a multiprocessing object that needs
    it (the extra reducer of ``shm.dumps``); None for anything else."""
    sent = _SENDING.get()
    if sent is None or "multiprocessing" not in sys.modules:
        return None
    from multiprocessing import connection, current_process, heap, queues, synchronize

    if isinstance(obj, connection.Connection):
        sent_fd = sent.send(obj.fileno(), obj)
        authkey = bytes(current_process().authkey)
        return _rebuild_connection, (sent_fd, obj.readable, obj.writable, authkey)
    if isinstance(obj, heap.Arena):
        return heap.rebuild_arena, (obj.size, sent.send(obj.fd, obj))
    if isinstance(obj, synchronize.SemLock):
        return _reduce_semlock(obj, sent)
    if isinstance(obj, queues.Queue):
        return _rebuild_queue, (type(obj), obj.__getstate__())
    ctypes_data = isinstance(obj, ctypes.Array | ctypes._SimpleCData | ctypes.Structure)
    wrapper = getattr(obj, "_wrapper", None) if ctypes_data else None
    if isinstance(wrapper, heap.BufferWrapper):
        return _reduce_ctype(obj, wrapper)
    return None


def handles(obj: object) -> bool:
    """Whether ``reduce`` pickles ``obj`` as a whole (a pipe end, a lock, a queue...)."""
    if "multiprocessing" not in sys.modules:
        return False
    from multiprocessing import connection, heap, queues, synchronize

    kinds = (connection.Connection, heap.Arena, synchronize.SemLock, queues.Queue)
    return isinstance(obj, kinds)


def _reduce_ctype(obj: object, wrapper: object) -> Reduced:
    # A RawValue/RawArray (also inside Value/Array): the ctypes object over
    # shared memory; pickled as usual it would be a copy of its bytes.
    from multiprocessing import sharedctypes

    rebuild = vars(sharedctypes)["rebuild_ctype"]  # public there, missing from typeshed
    if isinstance(obj, ctypes.Array):
        return rebuild, (obj._type_, wrapper, obj._length_)
    return rebuild, (type(obj), wrapper, None)


def _reduce_semlock(lock: synchronize.SemLock, sent: Sending) -> Reduced:
    # ``_semlock`` is the C semaphore every multiprocessing lock wraps (its
    # own pickling reads it too); handle, kind, maxvalue and name are public.
    sem = lock._semlock  # type: ignore[attr-defined]  # missing from typeshed
    state = (sem.kind, sem.maxvalue)
    if sem.name is not None:
        return _semlock, (type(lock), 0, *state, sem.name)  # opened by name
    found = _mapped(lock, sem.handle)
    if found is not None:
        fd, offset, size = found
        return _rebuild_mapped_semlock, (type(lock), *state, sent.send(fd, lock), offset, size)
    if sent.inherits:
        return _semlock, (type(lock), sem.handle, *state, None)  # the mapping came with fork
    raise MpObjectError(
        f"this multiprocessing {type(lock).__name__} was made in the 'fork' context, whose "
        "semaphores only forked processes can reach; make it with "
        "multiprocessing.get_context('spawn') (as torch's spawn requires), "
        "or launch with start_method='fork'"
    )


def _mapped(lock: object, address: int) -> tuple[int, int, int] | None:
    """``_mapping_of(address)``, opened once per lock and closed with it."""
    found = _SEMAPHORE_FILES.get(address)
    if found is None:
        found = _mapping_of(address)
        if found is None:
            return None
        _SEMAPHORE_FILES[address] = found
        weakref.finalize(lock, _forget_semaphore, address)
    return found


def _forget_semaphore(address: int) -> None:
    found = _SEMAPHORE_FILES.pop(address, None)
    if found is not None:
        os.close(found[0])


def _mapping_of(address: int) -> tuple[int, int, int] | None:
    """(a new descriptor of the file mapped at ``address``, the offset of
    ``address`` in it, the mapping's size), or None where Linux does not allow it."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                span = line.split(maxsplit=1)[0]
                start, end = (int(x, 16) for x in span.split("-"))
                if start <= address < end:
                    fd = os.open(f"/proc/self/map_files/{span}", os.O_RDWR | os.O_CLOEXEC)
                    return fd, address - start, end - start
    except OSError:
        return None
    return None


def _rebuild_connection(df: SentFd, readable: bool, writable: bool, authkey: bytes) -> object:
    import multiprocessing
    from multiprocessing import connection

    # What the rank sends through it may refer to this rank's resource_sharer,
    # which the notebook reaches with its own authkey.
    multiprocessing.current_process().authkey = authkey
    return connection.Connection(df.detach(), readable, writable)


def _semlock(cls: type, handle: int, kind: int, maxvalue: int, name: str | None) -> object:
    lock = cast(_Restorable, object.__new__(cls))
    lock.__setstate__((handle, kind, maxvalue, name))
    return lock


def _rebuild_mapped_semlock(
    cls: type, kind: int, maxvalue: int, df: SentFd, offset: int, size: int
) -> object:
    fd = df.detach()
    try:
        # The file may be shorter than the mapping's pages (a sem_t: 32 bytes).
        region = mmap.mmap(fd, min(size, os.fstat(fd).st_size), flags=mmap.MAP_SHARED)
    finally:
        os.close(fd)
    _MAPPINGS.append(region)
    address = ctypes.addressof(ctypes.c_char.from_buffer(region))
    return _semlock(cls, address + offset, kind, maxvalue, None)


def _rebuild_queue(cls: type, state: tuple[object, ...]) -> object:
    queue = cast(_Queue, object.__new__(cls))
    queue.__setstate__(state)
    _QUEUES.add(queue)
    return queue


def flush() -> None:
    """In a rank: wait until what it put on its multiprocessing queues is in their
    pipes (as a multiprocessing child does before it exits)."""
    for queue in list(_QUEUES):
        queue.close()
        queue.join_thread()
