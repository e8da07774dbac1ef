"""The payload: the function and its arguments, serialised once with cloudpickle.

``Payload.serialize(fn, args, kwargs)`` pickles them (``__main__``'s functions and classes by
value, large CPU tensors as shared memory: ``shm``; multiprocessing objects: ``mpobjects``), or
raises ``PayloadError`` naming the object, the path to it and what to do, before any process
starts. Ranks receive ``Payload.ref()`` beside their order and rebuild the ``Call`` with
``load_call(ref)``, which also registers the notebook's cell sources (``wire.sources``).
Code keeps the file it was written in, whatever file name cloudpickle gives it.
Non-goal: objects that only make sense in one process (locks, files, sockets, connections).
"""

from __future__ import annotations

import io
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from nbddp.errors import PayloadError
from nbddp.wire import mpobjects, shm
from nbddp.wire.cloud import CloudPickler
from nbddp.wire.descriptors import Descriptors, OwnedFd, memfd_with, read_all
from nbddp.wire.protocol import CallRef
from nbddp.wire.sources import Source, notebook_sources, register
from nbddp.wire.values import type_name

if TYPE_CHECKING:
    from _pickle import _ReducedType

LARGE_PAYLOAD_BYTES = 256 << 20

Fn = Callable[..., object]
"""A function the ranks call: the user's, whatever it takes and returns."""
Args = tuple[object, ...]
Kwargs = dict[str, object]


@dataclass(frozen=True)
class Call:
    """What a rank calls: ``fn(*args, **kwargs)``, and the notebook sources of its code."""

    fn: Fn
    args: Args
    kwargs: Kwargs
    sources: tuple[Source, ...] = ()
    """The notebook files the pickled code was written in (``wire.sources``)."""

    def __reduce__(self) -> tuple[type[Call], tuple[object, ...]]:
        # The sources last: while the call is pickled, they are collected from the
        # code pickled before them (``_SourcesFound``).
        return Call, (self.fn, self.args, self.kwargs, self.sources)


class _SourcesFound:
    """Stands for a call's sources while it is pickled; pickles as the sources of the
    notebook files whose functions were pickled before it."""

    def __init__(self) -> None:
        self.filenames: list[str] = []
        self.copies: dict[int, types.CodeType] = {}
        """id -> a code object's copy, pickled as cloudpickle pickles code."""

    def reduce(self, obj: object) -> mpobjects.Reduced | None:
        """The payload's extra reducer (``shm.dumps``): notes each function's file,
        pickles code with its file name beside it, and this placeholder as the
        sources found; the rest as ``mpobjects``."""
        if isinstance(obj, types.FunctionType):
            self.filenames.append(obj.__code__.co_filename)
        elif isinstance(obj, types.CodeType) and id(obj) not in self.copies:
            # cloudpickle may pickle code under a file name of its own (3.1.3:
            # ``<dynamic-code>``), which no linecache entry has: the rank puts the
            # real one back. A copy, so that the pickler's memo (by id) keeps both.
            copy = obj.replace()
            self.copies[id(copy)] = copy
            return _in_file, (copy, obj.co_filename)
        elif obj is self:
            return tuple, (notebook_sources(self.filenames),)
        return mpobjects.reduce(obj)


def _in_file(code: types.CodeType, filename: str) -> types.CodeType:
    """``code`` as written in ``filename`` (its nested code was restored before it)."""
    return code.replace(co_filename=filename)


@dataclass(frozen=True)
class Payload:
    """A pickled call: the bytes, and the shared-memory descriptors they refer to.

    Build it with ``serialize``; ``owned`` keeps the descriptors open as long as the
    payload lives (numpy arrays' memfds, the multiprocessing objects sent)."""

    data: bytes
    fds: tuple[int, ...] = ()
    owned: tuple[object, ...] = ()
    marks: dict[int, shm.Mark] = field(default_factory=dict)  # ``shm.SharingPickler.marks``

    def ref(self) -> CallRef:
        """What the ranks are sent to make the call: a new memory file holding the bytes,
        and the descriptors, all held until the ``CallRef`` is closed or dropped (once
        it is sent, every rank has its own copies)."""
        memfd = OwnedFd(memfd_with(self.data, "nbddp-call"))
        return CallRef(len(self.data), Descriptors([memfd.fd, *self.fds], keep=[self, memfd]))

    @classmethod
    def serialize(cls, fn: Fn, args: Args, kwargs: Kwargs, *, forked: bool = False) -> Payload:
        """Pickle the call once; ``PayloadError`` explains any failure.

        ``forked``: the ranks will be forked from this process (start method
        fork), so they can also reach what only inheritance shares."""
        if not callable(fn):
            raise PayloadError(
                f"the function to launch must be callable, got {type(fn).__name__} {fn!r:.60}"
            )
        found = _SourcesFound()
        call = Call(fn, tuple(args), dict(kwargs), cast(tuple[Source, ...], found))
        try:
            with mpobjects.sending(forked) as sent:
                data, fds, owned, marks = shm.dumps(call, found.reduce)
        except Exception as exc:
            raise PayloadError(_explain(fn, args, kwargs, exc)) from exc
        # Reversed: the k-th multiprocessing descriptor is fds[-1 - k] (see mpobjects).
        return cls(data, (*fds, *sent.fds[::-1]), (*owned, *sent.owned), marks)


def load_call(ref: CallRef) -> Call:
    """Rebuild the call in a rank from what it received (``Payload.ref``), mapping its
    shared memory, and register its notebook sources; the received descriptors are
    closed (the mappings keep their own)."""
    try:
        memfd, *fds = ref.fds.fds
        data = read_all(memfd, ref.size)
        with mpobjects.receiving(fds):
            call = shm.loads(data, fds)
    finally:
        ref.fds.close()
    if not isinstance(call, Call):
        raise TypeError(f"payload holds {type(call).__name__}, not a Call")
    register(call.sources)
    return call


def _explain(fn: Fn, args: Args, kwargs: Kwargs, exc: Exception) -> str:
    roots: list[tuple[str, object]] = [(_name(fn), fn)]
    roots += [(f"argument {i}", a) for i, a in enumerate(args)]
    roots += [(f"keyword argument {k!r}", v) for k, v in kwargs.items()]
    for label, obj in roots:
        path = find_unpicklable(obj, [label], set(), depth=0)
        if path is not None and isinstance(exc, mpobjects.MpObjectError):
            return f"cannot send {' -> '.join(path[:-1])} {path[-1]} to the workers: {exc}"
        if path is not None:
            return (
                f"cannot send {' -> '.join(path[:-1])} {path[-1]} to the workers: "
                f"it cannot be pickled ({short_error(exc)}). "
                "Create it inside the function instead of capturing it, "
                "or pass what is needed to build it (a path, a config)."
            )
    return (
        f"cannot send {_name(fn)} and its arguments to the workers: {short_error(exc)}. "
        "Create unpicklable objects (locks, open files, connections) inside the function."
    )


def short_error(exc: BaseException) -> str:
    """``Type: message``, cut to 200 characters, for one-line error messages."""
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 200 else text[:197] + "..."


def _name(fn: object) -> str:
    return str(getattr(fn, "__qualname__", None) or type(fn).__name__)


def _pickles(obj: object) -> bool:
    # As the payload pickles it (multiprocessing objects included), without
    # sharing memory: this only looks for the object that fails.
    try:
        with mpobjects.sending(inherits=False):
            _ProbePickler(io.BytesIO()).dump(obj)
    except Exception:
        return False
    return True


class _ProbePickler(CloudPickler):
    def reducer_override(self, obj: object) -> _ReducedType:
        reduced = mpobjects.reduce(obj)
        return reduced if reduced is not None else super().reducer_override(obj)


def find_unpicklable(obj: object, path: list[str], seen: set[int], depth: int) -> list[str] | None:
    """The path (labels from ``path`` on, ending with the culprit's type in parentheses)
    to the innermost object inside ``obj`` that fails to pickle; None if ``obj`` pickles."""
    if id(obj) in seen or depth > 12 or _pickles(obj):
        return None
    seen.add(id(obj))
    for label, child in _children(obj):
        found = find_unpicklable(child, [*path, label], seen, depth + 1)
        if found is not None:
            return found
    # Nothing inside fails on its own: this object is the culprit.
    return [*path, f"({type_name(obj)})"]


def _children(obj: object) -> Iterator[tuple[str, object]]:
    """The objects pickling ``obj`` would also pickle, labelled for a path."""
    if isinstance(obj, types.FunctionType):
        yield from _function_children(obj)
    elif isinstance(obj, types.MethodType):
        yield "bound to", obj.__self__
        yield _name(obj.__func__), obj.__func__
    elif isinstance(obj, dict):
        for key, value in obj.items():
            yield f"[{key!r:.40}]", value
    elif isinstance(obj, list | tuple | set | frozenset):
        for i, value in enumerate(obj):
            yield f"[{i}]", value
    elif mpobjects.handles(obj):
        return  # pickled as a whole: the culprit is itself, not its parts
    elif hasattr(obj, "__dict__") and not isinstance(obj, type | types.ModuleType):
        for key, value in vars(obj).items():
            yield f".{key}", value


def _function_children(fn: types.FunctionType) -> Iterator[tuple[str, object]]:
    code = fn.__code__
    for name, cell in zip(code.co_freevars, fn.__closure__ or (), strict=False):
        try:
            yield f"closure {name!r}", cell.cell_contents
        except ValueError:  # empty cell
            continue
    for name in _global_names(code):
        if name in fn.__globals__:
            value = fn.__globals__[name]
            if not isinstance(value, types.ModuleType):
                yield f"global {name!r}", value
    for i, default in enumerate(fn.__defaults__ or ()):
        yield f"default {i}", default
    for key, default in (fn.__kwdefaults__ or {}).items():
        yield f"default {key!r}", default


def _global_names(code: types.CodeType) -> Iterator[str]:
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _global_names(const)
