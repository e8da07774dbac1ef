"""A session rank's namespace: what a call may read, and what stays after it.

``Namespace.call(fn, sent)`` runs ``fn()`` with the notebook's values ``sent`` in ``globals`` for
names the ranks do not own. Afterwards every name the call bound to another value is the ranks'
(``owned``, never replaced by the notebook's); values only read are dropped, except those a cell
sends as ``lasting`` (kept, ``lent``, until a cell no longer sends them). ``Namespace.run(fn)``
does the same for a function from ``__main__``, rebuilt over ``globals``; others keep their own.
"""

from __future__ import annotations

import builtins
import types
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import TypeGuard, TypeVar

T = TypeVar("T")

_UNSET = object()


@dataclass
class Namespace:
    """One session rank's globals and the names in it that are the ranks' own."""

    globals: dict[str, object] = field(
        default_factory=lambda: {"__name__": "__main__", "__builtins__": builtins}
    )
    owned: set[str] = field(default_factory=set)
    lent: set[str] = field(default_factory=set)
    """The notebook's names left in ``globals`` after a cell (``lasting``)."""

    def call(
        self,
        fn: Callable[[], T],
        sent: Mapping[str, object],
        lasting: Collection[str] | None = None,
    ) -> T:
        """``fn()`` with ``sent`` in ``globals``. ``lasting``: a cell's (all the notebook's
        names it lends); None: a call's, which leaves the names lent as they are."""
        ns = self.globals
        if lasting is not None:
            for name in self.lent - sent.keys() - self.owned:
                ns.pop(name, None)  # the notebook no longer has it
            self.lent = set(lasting) & sent.keys()
        ns.update({name: value for name, value in sent.items() if name not in self.owned})
        before = dict(ns)
        try:
            return fn()
        finally:
            self._settle(sent, before)
            # An exception's frames would otherwise keep every value alive.
            del before

    def run(
        self, fn: Callable[..., object], args: tuple[object, ...], kwargs: dict[str, object]
    ) -> object:
        """``fn(*args, **kwargs)``, in ``globals`` if ``fn`` is the notebook's."""
        if not _from_main(fn):
            return fn(*args, **kwargs)
        theirs = fn.__globals__
        sent = {n: v for n, v in theirs.items() if not (n.startswith("__") and n.endswith("__"))}
        for name, value in sent.items():
            if _from_main(value) and value.__globals__ is theirs:
                sent[name] = self._rebuilt(value)
        rebuilt = self._rebuilt(fn)
        return self.call(lambda: rebuilt(*args, **kwargs), sent)

    def _settle(self, sent: Mapping[str, object], before: Mapping[str, object]) -> None:
        ns = self.globals
        bound = {name for name, value in ns.items() if before.get(name, _UNSET) is not value}
        self.owned = {name for name in self.owned if name in ns} | {
            name for name in bound if name not in sent or ns[name] is not sent[name]
        }
        self.lent -= self.owned
        for name, value in sent.items():
            if name not in self.owned | self.lent and ns.get(name, _UNSET) is value:
                del ns[name]

    def _rebuilt(self, fn: types.FunctionType) -> types.FunctionType:
        copy = types.FunctionType(
            fn.__code__, self.globals, fn.__name__, fn.__defaults__, fn.__closure__
        )
        copy.__kwdefaults__ = fn.__kwdefaults__
        copy.__qualname__ = fn.__qualname__
        copy.__dict__.update(fn.__dict__)
        return copy


def _from_main(value: object) -> TypeGuard[types.FunctionType]:
    return isinstance(value, types.FunctionType) and value.__module__ == "__main__"
