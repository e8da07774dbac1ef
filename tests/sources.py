"""Notebook cells the tests of failures run: code a user would write, kept in one place."""

# Rank 1 raises before the loop; rank 0 then breaks in its first all_reduce (a rank
# stopped only because another failed). The raising line is line 7 of the cell.
FAILING_TRAIN = """\
import torch
import torch.distributed as dist

def train(steps):
    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        raise ValueError("bad batch on rank 1")
    t = torch.ones(1)
    for _ in range(steps):
        dist.all_reduce(t)
    return t.item()
"""
