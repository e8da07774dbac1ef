"""The running rank's context: who it is in the run and which device it has.

The worker ``install``s the rank's ``Placement`` (from its order, never from the environment)
before the function runs; code in the rank asks ``current()`` (None outside a launched rank) or
``require()`` (which raises there); ``device(place)`` is its ``torch.device``.
``WithRank(fn)(*args)`` calls ``fn(rank, *args)``, as ``torch.multiprocessing.spawn`` does
(``nbddp.spawn``); pickled by reference, it needs no more than this module in the rank.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

from nbddp.wire.protocol import Placement

if TYPE_CHECKING:
    import torch

__all__ = ["Placement", "WithRank", "current", "device", "install", "require"]

_installed: Placement | None = None


def install(place: Placement | None) -> None:
    """Make ``place`` this process's rank context (the worker, once); None removes it."""
    global _installed
    _installed = place


def current() -> Placement | None:
    """This rank's context; None outside a launched rank."""
    return _installed


def require() -> Placement:
    """This rank's context; ``RuntimeError`` outside a launched rank."""
    if _installed is None:
        raise RuntimeError(
            "not inside a rank launched by nbddp: rank, world size and device are "
            "only known there (launch the function with nbddp.launch or %%ddp)"
        )
    return _installed


def device(place: Placement) -> torch.device:
    """The rank's ``torch.device``: its GPU when it has one, else the CPU."""
    import torch

    if place.cuda_index is not None:
        return torch.device("cuda", place.cuda_index)
    return torch.device("cpu")


R = TypeVar("R")


@dataclass(frozen=True)
class WithRank(Generic[R]):
    """``fn(rank, *args)``, as torch.multiprocessing.spawn calls it."""

    fn: Callable[..., R]

    def __call__(self, *args: object) -> R:
        return self.fn(require().rank, *args)
