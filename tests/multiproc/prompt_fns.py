"""Module-level functions the prompt tests launch (ranks import them by reference)."""

from __future__ import annotations

import os
import time


def ask_then_return() -> int:
    """Rank 1 asks for a line; rank 0 returns at once (and waits for its peers)."""
    import torch.distributed as dist

    if dist.get_rank() == 1:
        input("go? ")
    return dist.get_rank()


def ask_or_fail(flag: str) -> None:
    """Rank 0 asks for a line; rank 1 raises once ``flag`` exists."""
    import torch.distributed as dist

    if dist.get_rank() == 0:
        input("name? ")
        return
    while not os.path.exists(flag):
        time.sleep(0.01)
    raise ValueError("rank 1 failed while rank 0 was asked")
