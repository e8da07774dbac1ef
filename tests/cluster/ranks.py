"""What the cluster tests run on their ranks: light to import (a rank unpickles a
function by importing its module, and the test modules import Ray)."""

from __future__ import annotations

import os
import time
from pathlib import Path

ENV_NAMES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "CUDA_VISIBLE_DEVICES",
)


class StepFailed(Exception):
    """A rank's own exception type, to be raised as itself in the notebook."""


def all_reduce_ranks(gate: str) -> dict[str, object]:
    """Print, wait for ``gate`` to exist, then sum the ranks over one gloo group."""
    import torch
    import torch.distributed as dist

    print(f"ready on rank {os.environ['RANK']}", flush=True)
    while not Path(gate).exists():
        time.sleep(0.02)
    dist.init_process_group("gloo")
    total = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(total)
    dist.destroy_process_group()
    return {"sum": total.item(), "env": {name: os.environ.get(name) for name in ENV_NAMES}}


def env_of_rank() -> dict[str, str | None]:
    return {name: os.environ.get(name) for name in ENV_NAMES}


def fail_on_rank(bad: int) -> None:
    if int(os.environ["RANK"]) == bad:
        raise StepFailed(f"step failed on rank {bad}")
    time.sleep(60)  # stopped after the failure's grace


def sleep_forever() -> None:
    print("sleeping", flush=True)
    time.sleep(600)


def sleep_in_a_named_function() -> None:
    stuck_here_for_a_while()


def stuck_here_for_a_while() -> None:
    time.sleep(600)


def scaled(weights: object) -> object:
    """A large tensor argument back, doubled, from every rank."""
    return weights * 2  # type: ignore[operator]


def wait_for(gate: str, value: str) -> str:
    """Wait for ``gate`` to exist, then return ``value``."""
    while not Path(gate).exists():
        time.sleep(0.02)
    return value


def secret_and_line_on(asking: int) -> tuple[str, str] | None:
    """Rank ``asking`` reads a password (``getpass``) and then a line (``input``)."""
    import getpass

    if int(os.environ["RANK"]) != asking:
        return None
    return getpass.getpass(), input("line? ")
