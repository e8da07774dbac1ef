"""Tiny module-level entry points for multi-process tests: return, raise, exit, crash, hang.

Workers import this module by reference (it is on the notebook's sys.path).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from typing import Any


def all_reduce_sum(x: float) -> float:
    """Init gloo, all_reduce rank + x, return the sum."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.tensor([dist.get_rank() + x])
    dist.all_reduce(t)
    print(f"rank {dist.get_rank()} of {dist.get_world_size()}: sum {t.item()}")
    dist.destroy_process_group()
    return float(t.item())


def environment() -> dict[str, Any]:
    """The rank's view of its environment and torch state."""
    import torch

    keys = [
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "NODE_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "CUDA_VISIBLE_DEVICES",
        "OMP_NUM_THREADS",
        "ACCELERATE_MIXED_PRECISION",
        "PYTHONUNBUFFERED",
        "EXTRA",
    ]
    return {
        "env": {k: os.environ.get(k) for k in keys},
        "cuda_initialized": torch.cuda.is_initialized(),
        "threads": torch.get_num_threads(),
        "cwd": os.getcwd(),
        "pgid_is_pid": os.getpgrp() == os.getpid(),
    }


def talk() -> str:
    """Write through every path: print, sys.stderr, fd 1 and 2 directly, and C stdio."""
    rank = os.environ["RANK"]
    print(f"py-stdout {rank}")
    print(f"py-stderr {rank}", file=sys.stderr)
    os.write(1, f"fd1 {rank}\n".encode())
    os.write(2, f"fd2 {rank}\n".encode())
    libc = ctypes.CDLL(None)
    libc.puts(f"c-puts {rank}".encode())
    libc.fflush(None)
    return rank


def wait_on_fifo(path: str) -> str:
    """Print 'ready', then block until the test writes a line into the FIFO ``path.RANK``."""
    rank = os.environ["RANK"]
    print(f"ready {rank}", flush=True)
    with open(f"{path}.{rank}") as fifo:
        return fifo.readline().strip()


def init_then_return(fifo: str) -> int:
    """Initialise the process group and return; rank 1 first waits for a line in ``fifo``."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        with open(fifo) as f:
            f.readline()
    return dist.get_rank()


class CustomError(Exception):
    """An exception type the notebook can rebuild."""


class Unpicklable(Exception):
    """An exception that cannot cross processes (it holds a lock)."""

    def __init__(self, msg: str) -> None:
        super().__init__(msg)
        self.lock = threading.Lock()


def fail_on(rank_to_fail: int, how: str) -> str:
    """Fail on one rank in the way ``how`` says; the other ranks block in a collective."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if rank == rank_to_fail:
        print(f"rank {rank} about to {how}", flush=True)
        if how == "raise":
            raise CustomError(f"boom on rank {rank}")
        if how == "unpicklable":
            raise Unpicklable("holds a lock")
        if how == "sys.exit":
            sys.exit(3)
        if how == "os._exit":
            os._exit(9)
        if how == "segfault":
            ctypes.string_at(0)
        if how == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
    t = torch.zeros(1)
    dist.all_reduce(t)  # blocks: the failing rank never joins
    return "unreachable"


def dataloader_then_fail(fifo: str | None = None) -> None:
    """Iterate a DataLoader with 2 worker processes, say their pids, then on rank 1
    raise (or block on ``fifo`` first), and on the other ranks block with the workers
    running: nbddp must stop those ranks, and their workers with them."""
    import psutil
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    loader = DataLoader(TensorDataset(torch.arange(64.0)), batch_size=4, num_workers=2)
    batches = iter(loader)
    for _ in range(3):
        next(batches)
    workers = [p.pid for p in psutil.Process().children()]
    print(f"ready {os.environ['RANK']} workers {workers}", flush=True)
    if fifo is not None:
        with open(fifo) as f:
            f.readline()
    if os.environ["RANK"] != "1":
        threading.Event().wait()  # holds the iterator, so its workers run on
    raise RuntimeError("failed while DataLoader workers run")


def hang() -> None:
    """Block forever in Python."""
    print("hanging", flush=True)
    threading.Event().wait()


def accelerate_view() -> dict[str, Any]:
    """What accelerate's Accelerator() sees inside the launch."""
    from accelerate import Accelerator

    acc = Accelerator()
    t = acc.reduce(__import__("torch").tensor([1.0]), reduction="sum")
    acc.print(f"accelerate sees {acc.num_processes} processes")
    return {
        "num_processes": acc.num_processes,
        "process_index": acc.process_index,
        "mixed_precision": acc.mixed_precision,
        "distributed_type": str(acc.distributed_type),
        "reduced": float(t.item()),
    }


def spawn_style(rank: int, world_size: int, out_dir: str) -> None:
    """torch.multiprocessing.spawn's calling convention: fn(rank, *args)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    with open(os.path.join(out_dir, f"rank{rank}"), "w") as f:
        f.write(f"{dist.get_rank()}/{dist.get_world_size()}")
    # As a training script's collectives do: no rank closes its connections (destroy)
    # while a peer may still be completing its side of the group's connections.
    dist.barrier()
    dist.destroy_process_group()


def return_early_on(rank_to_return: int) -> str:
    """One rank returns at once; the other waits in a collective that can never complete."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    if dist.get_rank() == rank_to_return:
        return "left early"
    dist.all_reduce(torch.zeros(1))
    return "unreachable"


def write_then_sigkill(nbytes: int) -> None:
    """Write ``nbytes`` of numbered lines to stdout, then die by SIGKILL without flushing."""
    line = 0
    written = 0
    while written < nbytes:
        chunk = f"line {line:08d}\n"
        sys.stdout.write(chunk)
        written += len(chunk)
        line += 1
    sys.stdout.flush()
    os.write(2, b"last words on fd 2\n")
    os.kill(os.getpid(), signal.SIGKILL)


def listening_sockets() -> list[tuple[str, int]]:
    """The rank's own listening TCP sockets, after joining the group."""
    import psutil
    import torch.distributed as dist

    dist.init_process_group("gloo")
    dist.barrier()
    conns = psutil.Process().net_connections("inet")
    listening = sorted({(c.laddr.ip, c.laddr.port) for c in conns if c.status == "LISTEN"})
    dist.barrier()
    dist.destroy_process_group()
    return listening


def digest(t: Any) -> str:
    """An exact fingerprint of a CPU tensor's contents."""
    import hashlib

    return hashlib.sha256(t.detach().contiguous().numpy().tobytes()).hexdigest()


def checksum_and_scribble(t: Any, model: Any) -> dict[str, str]:
    """Fingerprint the shared inputs, then write to them (the notebook must not see it)."""
    import torch

    out = {"data": digest(t), "weight": digest(model.weight)}
    with torch.no_grad():
        t.add_(1)
        model.weight.zero_()
    return out


LEFT_BEHIND: str | None = None
"""Set by ``leave_state``; a fresh process imports this module with it None."""


def leave_state() -> tuple[int, int]:
    """Leave state in this process every way a run can: a module global, the
    environment, ``sys.modules``, a process group (not destroyed). Returns the pid
    and its parent's (the rank's keeper)."""
    import types

    import torch.distributed as dist

    global LEFT_BEHIND
    LEFT_BEHIND = "left"
    os.environ["NBDDP_TEST_LEFT"] = "left"
    sys.modules["nbddp_test_left"] = types.ModuleType("nbddp_test_left")
    dist.init_process_group("gloo")
    return os.getpid(), os.getppid()


def find_state() -> dict[str, Any]:
    """What this process still has of ``leave_state``'s, and whether CUDA is initialised."""
    import torch
    import torch.distributed as dist

    return {
        "global": LEFT_BEHIND,
        "env": os.environ.get("NBDDP_TEST_LEFT"),
        "module": "nbddp_test_left" in sys.modules,
        "group": dist.is_initialized(),
        "cuda_initialized": torch.cuda.is_initialized(),
        "pid": os.getpid(),
    }


def _stuck_inner() -> None:
    threading.Event().wait()


def stuck_in_user_code() -> None:
    """Block forever two calls deep in the user's own code, with a helper thread of its own."""
    threading.Thread(target=_stuck_inner, name="user-helper", daemon=True).start()
    print("stuck", flush=True)
    _stuck_inner()


def stuck_with_own_sigusr1() -> None:
    """Claim SIGUSR1 for the user's own handler (as checkpoint-on-signal code does), then block."""
    signal.signal(signal.SIGUSR1, lambda *_: print("user's SIGUSR1 handler ran", flush=True))
    print("stuck", flush=True)
    _stuck_inner()


def stuck_holding_the_gil() -> None:
    """Spin in C code that never releases the GIL (a regex that backtracks for ages)."""
    import re

    print("spinning", flush=True)
    re.match(r"(a+)+$", "a" * 64 + "b")


def memory_after_all_reduce() -> dict[str, int]:
    """Join gloo, all_reduce, and return this rank's memory figures (kB) from
    ``/proc/self/smaps_rollup``: ``AnonHugePages`` and ``Private_Dirty``."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == dist.get_world_size()
    figures = {}
    with open("/proc/self/smaps_rollup") as rollup:
        for line in rollup:
            key, _, value = line.partition(":")
            if key in ("AnonHugePages", "Private_Dirty"):
                figures[key] = int(value.split()[0])
    return figures


def pid_and_keeper() -> tuple[int, int]:
    """This rank's pid and its parent's (the rank's keeper)."""
    return os.getpid(), os.getppid()


def loaded_modules() -> list[str]:
    """Every module this process has loaded, sorted."""
    return sorted(sys.modules)


def bar_then_print(epochs: int) -> None:
    """A training loop's output: a progress bar on stderr (tqdm's way: ``\\r`` redraws,
    flushed), then a line on stdout, each epoch."""
    import sys

    for epoch in range(epochs):
        for step in range(1, 4):
            sys.stderr.write(f"\rbar {epoch}: {step}/3")
            sys.stderr.flush()
        sys.stderr.write("\n")
        print(f"epoch {epoch} finished")


def read_lines(count: int, on_rank: int = 0) -> list[tuple[int, str, float]]:
    """On rank ``on_rank`` (the others read nothing): read ``count`` lines from the user
    (``sys.stdin``: no echo); for each, its length, its sha256 and the seconds from asking
    to having it."""
    import hashlib
    import time

    got = []
    for _ in range(count if int(os.environ["RANK"]) == on_rank else 0):
        start = time.monotonic()
        line = sys.stdin.readline().rstrip("\n")
        took = time.monotonic() - start
        got.append((len(line), hashlib.sha256(line.encode()).hexdigest(), took))
    return got


def length_and_sha256(data: bytes) -> tuple[int, str]:
    """The length and sha256 of ``data`` as the rank received it."""
    import hashlib

    return len(data), hashlib.sha256(data).hexdigest()
