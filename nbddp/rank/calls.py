"""Wrappers a launch puts around the user's function; they run in the rank.

``WithRank(fn)(*args)`` calls ``fn(rank, *args)``, as ``torch.multiprocessing.spawn`` does
(``nbddp.spawn``). Pickled by reference: a rank that unpickles one imports only this module.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from nbddp.rank import context

R = TypeVar("R")


@dataclass(frozen=True)
class WithRank(Generic[R]):
    """``fn(rank, *args)``, as torch.multiprocessing.spawn calls it."""

    fn: Callable[..., R]

    def __call__(self, *args: object) -> R:
        return self.fn(context.require().rank, *args)
