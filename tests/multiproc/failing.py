"""Module-level entry points for the failure-path tests: forked children, odd exceptions.

Workers import this module by reference (it is on the notebook's sys.path).
"""

from __future__ import annotations

import os
from typing import Any

import nbddp

ROWS = 64  # rows each rank's children log in all


class StrRaises(Exception):
    """An exception whose ``__str__`` itself raises."""

    def __str__(self) -> str:
        raise RuntimeError("str() of this exception fails")


class RebuildsAsInt(Exception):
    """An exception that pickles, but unpickles as an ``int``."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (int, (5,))


def raise_str_raises() -> None:
    raise StrRaises("unprintable")


def raise_rebuilds_as_int() -> None:
    raise RebuildsAsInt("rebuilt as an int")


class Numbered:
    """A dataset whose items log a row from the DataLoader worker that loads them."""

    def __len__(self) -> int:
        return ROWS

    def __getitem__(self, i: int) -> int:
        nbddp.log(item=i)
        return i


def log_in_dataloader_workers() -> int:
    """Iterate a DataLoader whose 2 forked workers each log a row per item."""
    from torch.utils.data import DataLoader

    loader = DataLoader(Numbered(), batch_size=4, num_workers=2, multiprocessing_context="fork")
    return sum(int(batch.sum()) for batch in loader)


def log_in_forked_children() -> int:
    """Fork two children with ``os.fork``; each logs half the rows and leaves by ``os._exit``."""
    pids = []
    for child in range(2):
        pid = os.fork()
        if pid == 0:
            for i in range(child, ROWS, 2):
                nbddp.log(item=i)
            os._exit(0)
        pids.append(pid)
    for pid in pids:
        os.waitpid(pid, 0)
    return len(pids)


def fork_child_returns_late(how: str) -> str:
    """Fork a child that returns (or raises) into nbddp only once this rank has exited."""
    r, w = os.pipe()
    if os.fork() == 0:
        os.close(w)
        os.read(r, 1)  # EOF: the rank (the only other holder of ``w``) has exited
        if how == "raise":
            raise RuntimeError("raised in the forked child")
        return "the child's value"
    os.close(r)
    return "the rank's value"


def log_in_spawned_dataloader_workers() -> int:
    """Iterate a DataLoader whose workers are spawned: they have no way to the notebook."""
    from torch.utils.data import DataLoader

    loader = DataLoader(Numbered(), batch_size=4, num_workers=1, multiprocessing_context="spawn")
    return sum(int(batch.sum()) for batch in loader)
