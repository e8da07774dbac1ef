"""Wrappers a launch puts around the user's function; they run in the rank.

Contract: ``WithRank(fn)(*args)`` calls ``fn(rank, *args)``, as
``torch.multiprocessing.spawn`` calls its function (``nbddp.spawn``), with
the rank taken from the rank's context (``nbddp.rank.context``). Wrappers
are pickled by reference, so they live on the rank's side: a rank that
unpickles one imports this small module, not the notebook's launcher.
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
