"""What the ranks run to produce the failures the troubleshooting page quotes
(imported by the ranks by name, as a module of the user's would be)."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import torch.distributed as dist


def returns() -> int:
    return 1


def train() -> int:
    return 1


def killed_on_rank_1() -> None:
    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()  # rank 0 waits here until it is stopped


def exits_3_on_rank_0() -> None:
    dist.init_process_group("gloo")
    if dist.get_rank() == 0:
        os._exit(3)
    dist.barrier()


def refuse() -> None:
    """Rebuilding the value in the notebook fails here."""
    raise RuntimeError("this object lives in the rank only")


class Unrebuildable:
    def __reduce__(self) -> tuple[Any, ...]:
        return (refuse, ())


def returns_unrebuildable() -> Unrebuildable:
    return Unrebuildable()


def runs_long() -> None:
    time.sleep(60)  # the work a timeout ends; nothing waits on it


def cell_value_unrebuildable() -> Unrebuildable:
    """What a ``%%ddp --out`` name holds that the notebook cannot rebuild."""
    return Unrebuildable()


def takes(value: object) -> int:
    return 1
