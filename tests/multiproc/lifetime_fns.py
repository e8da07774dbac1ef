"""Module-level entry points for tests/multiproc/test_lifetime.py.

Workers import this module by reference (it is on the notebook's sys.path).
"""

from __future__ import annotations

import os
from typing import Any


class BadBatch(Exception):
    """A user's error carrying the batch that broke the step."""

    def __init__(self, message: str, batch: Any) -> None:
        super().__init__(message, batch)
        self.batch = batch


def total(x: Any) -> float:
    """The sum of the tensor ``x`` (the payload's), as a float."""
    return float(x.sum())


def fail_with(x: Any) -> None:
    """Read the payload's tensor, then raise."""
    raise ValueError(f"failed after reading {x.numel()} numbers")


def tensor_of(mib: int) -> Any:
    """Rank 0: a tensor of ``mib`` MiB (ranks in shared memory); others: None."""
    import torch

    if os.environ["RANK"] != "0":
        return None
    return torch.full(((mib << 20) // 4,), 7.0)


def raise_bad_batch(mib: int) -> None:
    """Rank 0 raises ``BadBatch`` holding a ``mib`` MiB tensor; the others return."""
    import torch

    if os.environ["RANK"] == "0":
        batch = torch.arange((mib << 20) // 4, dtype=torch.float32)
        raise BadBatch("loss became nan on this batch", batch)


def every_rank_raises_bad_batch(mib: int) -> None:
    """Each rank raises ``BadBatch`` holding a ``mib`` MiB tensor of its rank number."""
    import torch

    rank = int(os.environ["RANK"])
    raise BadBatch(f"rank {rank} broke", torch.full(((mib << 20) // 4,), float(rank)))
