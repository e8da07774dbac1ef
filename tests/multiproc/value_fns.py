"""Module-level entry points returning values for tests/multiproc/test_results.py.

Workers import this module by reference (it is on the notebook's sys.path).
"""

from __future__ import annotations

import collections
import os
import sys
import tempfile
from typing import Any

LAYERS = 4


def big_values(mib: int) -> Any:
    """Rank 0: a tensor, a numpy array and a state_dict of ``mib`` MiB each, and a small tensor."""
    import numpy as np
    import torch

    if os.environ["RANK"] != "0":
        return None
    numel = (mib << 20) // 4
    state = collections.OrderedDict(
        (f"layer{i}.weight", torch.full((numel // LAYERS,), float(i))) for i in range(LAYERS)
    )
    return {
        "tensor": torch.arange(numel, dtype=torch.float32),
        "array": np.arange(numel, dtype=np.float32),
        "state": state,
        "small": torch.ones(3),
    }


def rank1_returns_a_class_only_ranks_import() -> Any:
    """Rank 0 returns a string; rank 1 an object of a class the notebook cannot import."""
    if os.environ["RANK"] == "0":
        return "plain"
    where = tempfile.mkdtemp(prefix="nbddp-test-")
    with open(os.path.join(where, "rank_only_mod.py"), "w") as f:
        f.write("class Thing:\n    pass\n")
    sys.path.insert(0, where)
    import rank_only_mod  # type: ignore[import-not-found]

    return rank_only_mod.Thing()


def _explode() -> None:
    raise ValueError("bad state")


class Fragile:
    """Pickles fine; unpickling it raises ValueError."""

    def __reduce__(self) -> tuple[Any, ...]:
        return _explode, ()


def rank0_returns_a_value_that_fails_to_unpickle() -> Any:
    """Rank 0 returns a ``Fragile``."""
    return Fragile() if os.environ["RANK"] == "0" else None
