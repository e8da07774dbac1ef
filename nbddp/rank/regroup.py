"""Freeing a session's ranks from a collective, and giving them a new process group.

Contract: when a session rank raised before a collective its peers entered,
the peers stay blocked in C, out of reach of an interrupt. With gloo,
``close_group()`` on the idle ranks (they destroy their default process
group) closes the connections the blocked peers wait on, so their
collective raises ("Connection closed by peer") and they return to idle.
Then ``regroup(n)`` on every rank replaces the default process group by a
new one with the same backend, rank and world size, rendezvousing under its
own prefix (``nbddp/regroup/<n>/``) in the run's store (``MASTER_ADDR``,
``MASTER_PORT``), so no key of the first group is read again. It returns
once every rank has the new group, or raises.

Objects bound to the old group (a ``DistributedDataParallel`` wrapper,
groups from ``new_group``) are broken afterwards: the notebook says to
re-create them. Other backends are not freed this way (an nccl wait is on
the device): the notebook ends the session instead.
"""

from __future__ import annotations

import os
from datetime import timedelta

REGROUP_TIMEOUT = 30.0  # seconds every rank gets to join the new group


def close_group() -> None:
    """Destroy this rank's default process group, if it has one."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def regroup(number: int, backend: str, rank: int, world_size: int) -> None:
    """Give this rank a new default process group (see module contract)."""
    import torch.distributed as dist

    close_group()
    timeout = timedelta(seconds=REGROUP_TIMEOUT)
    store = dist.TCPStore(  # type: ignore[attr-defined]  # exported at runtime
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), None, False, timeout
    )
    prefix = dist.PrefixStore(f"nbddp/regroup/{number}/", store)  # type: ignore[attr-defined]
    dist.init_process_group(
        backend=backend, store=prefix, rank=rank, world_size=world_size, timeout=timeout
    )
    # As at the start: no rank goes on until every rank's group is complete.
    if prefix.add("joined", 1) >= world_size:
        prefix.set("all_joined", "1")
    else:
        prefix.wait(["all_joined"])
