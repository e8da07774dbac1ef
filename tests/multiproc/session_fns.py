"""Functions that session tests run in the ranks (imported there by reference)."""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any

_KEPT: dict[str, Any] = {}


def keep(key: str, value: Any) -> None:
    """Remember ``value`` in this rank (module state survives between calls)."""
    _KEPT[key] = value


def kept(key: str) -> Any:
    """What ``keep`` remembered in this rank."""
    return _KEPT[key]


def identity() -> list[tuple[int, int]]:
    """Each rank's (pid, id of its default process group), gathered on every rank."""
    import torch.distributed as dist

    mine = (os.getpid(), id(dist.group.WORLD))
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    return [tuple(x) for x in every]


def fail_on(rank: int) -> None:
    """Raise on ``rank``; return on the others."""
    import torch.distributed as dist

    if dist.get_rank() == rank:
        raise ValueError(f"rank {rank} fails its cell")


def fail_before_all_reduce(rank: int) -> None:
    """Raise on ``rank`` before an all_reduce the others enter (and block in)."""
    import torch
    import torch.distributed as dist

    if dist.get_rank() == rank:
        raise ValueError("raised before the all_reduce")
    dist.all_reduce(torch.ones(1))


def wait_forever() -> None:
    """Say so on stdout, then block (interruptibly) until interrupted."""
    print("waiting", flush=True)
    threading.Event().wait()


def kill_self_on(rank: int) -> None:
    """``rank`` SIGKILLs itself; the others wait."""
    import torch.distributed as dist

    if dist.get_rank() == rank:
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Event().wait()


def print_lines(count: int) -> int:
    """Print ``count`` numbered lines; return the rank."""
    import torch.distributed as dist

    rank = dist.get_rank()
    for i in range(count):
        print(f"rank {rank} line {i}")
    return rank


def fail_while_a_peer_is_stuck(rank: int) -> None:
    """Raise on ``rank``; the others block where no interrupt reaches them (SIGINT
    masked in C code's thread) and closing the process group does not help."""
    import time

    import torch.distributed as dist

    if dist.get_rank() == rank:
        raise ValueError("raised while a peer is stuck")
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    time.sleep(3600)


def all_reduce_sum() -> float:
    """An all_reduce of ones over the current default group."""
    import torch
    import torch.distributed as dist

    t = torch.ones(1)
    dist.all_reduce(t)
    return float(t.item())


def lose_the_first_interrupt() -> None:
    """Take the first SIGINT with a handler that does nothing, as a signal that lands just
    before the main thread blocks on a lock is taken, then block until interrupted."""
    ours = signal.getsignal(signal.SIGINT)
    taken = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: taken.set())
    print("waiting", flush=True)
    while not taken.wait(0.05):
        pass
    signal.signal(signal.SIGINT, ours)
    threading.Event().wait()
