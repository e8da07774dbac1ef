"""Bringing a rank's return value back to the notebook: time and memory, side by side.

    .venv/bin/python tests/bench/results.py [--mib 100 1024] [--json PATH]

For each size, rank 0 of 2 CPU ranks builds a value of that many MiB and
returns it: a float32 tensor, and a ``state_dict``-like ``OrderedDict`` (64
weight tensors plus 64 small biases). The anchor is torch.multiprocessing:
two spawned processes, rank 0 putting the same value on a torch
``SimpleQueue`` that the parent reads (torch's own shared-memory reductions).

Columns: the whole call (launch to value in hand); "return" is from the
moment rank 0 had its value built (a timestamp it takes just before
returning) until the notebook holds it, and the throughput that gives;
"x floor": the return against one in-process copy of the same value
(``clone()`` of each tensor, measured in the same run just before), the
least any way of bringing it back could cost; beside it one ``write()`` of the
same bytes into a memfd, in-process: what filling memory another process can
map costs at the least; the notebook's peak resident
memory above what it held before, sampled every 10 ms, as a multiple of the
value's size. ``--json`` also writes the table
to a file (``benchjson``, for ``plot.py``). Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import gc
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import torch
import torch.multiprocessing as mp

LAYERS = 64


def build(kind: str, mib: int) -> Any:
    """The value: one tensor, or a state_dict of ``LAYERS`` weights and biases."""
    numel = (mib << 20) // 4
    if kind == "tensor":
        return torch.ones(numel)
    state: collections.OrderedDict[str, torch.Tensor] = collections.OrderedDict()
    for i in range(LAYERS):
        state[f"layer{i}.weight"] = torch.ones(numel // LAYERS - 1024)
        state[f"layer{i}.bias"] = torch.ones(1024)
    return state


def copy_time(kind: str, mib: int) -> float:
    """Seconds for one in-process copy of the value (the floor a return is held to)."""
    value = build(kind, mib)
    tensors = [value] if kind == "tensor" else list(value.values())
    start = time.perf_counter()
    copies = [t.clone() for t in tensors]
    elapsed = time.perf_counter() - start
    del copies, value, tensors
    gc.collect()
    return elapsed


def memfd_write_time(tensors: list[torch.Tensor]) -> float:
    """Seconds for one in-process ``write()`` of the tensors' bytes into a new memfd: the
    least a copy into memory another process can map costs (shared memory's own floor)."""
    fd = os.memfd_create("floor")
    try:
        start = time.perf_counter()
        for t in tensors:
            view = memoryview(t.numpy()).cast("B")
            while view:
                view = view[os.write(fd, view) :]
        return time.perf_counter() - start
    finally:
        os.close(fd)


def shared_write_time(kind: str, mib: int) -> float:
    """``memfd_write_time`` of the value."""
    value = build(kind, mib)
    elapsed = memfd_write_time([value] if kind == "tensor" else list(value.values()))
    del value
    gc.collect()
    return elapsed


def stamp_file(stamps: str) -> Path:
    """Where rank 0 notes the time its value was ready."""
    return Path(stamps) / "ready"


def make_task(kind: str, mib: int, stamps: str) -> Callable[[], Any]:
    """What an nbddp rank runs: rank 0 builds the value, stamps the time and returns it."""

    def task() -> Any:
        import os
        import time

        if os.environ["RANK"] != "0":
            return None
        value = build(kind, mib)
        stamp_file(stamps).write_text(repr(time.time()))
        return value

    return task


def nbddp_launch(kind: str, mib: int, stamps: str) -> Any:
    """nbddp: 2 CPU ranks, rank 0's value returned by ``launch``."""
    import nbddp

    return nbddp.launch(make_task(kind, mib, stamps), procs=2, output="none")


def torch_rank(rank: int, kind: str, mib: int, stamps: str, out: Any, ack: Any) -> None:
    """torch.multiprocessing's side: rank 0 puts the value on the queue and waits
    until the parent has it (its fds are served by this process)."""
    if rank != 0:
        return
    value = build(kind, mib)
    stamp_file(stamps).write_text(repr(time.time()))
    out.put(value)
    ack.get()


def torch_launch(kind: str, mib: int, stamps: str) -> Any:
    """Two spawned processes; rank 0's value comes back through a torch SimpleQueue."""
    ctx = mp.get_context("spawn")
    out, ack = ctx.SimpleQueue(), ctx.SimpleQueue()
    procs = [
        ctx.Process(target=torch_rank, args=(r, kind, mib, stamps, out, ack)) for r in range(2)
    ]
    for p in procs:
        p.start()
    value = out.get()
    ack.put(True)
    for p in procs:
        p.join()
    return value


@contextlib.contextmanager
def peak_rss() -> Iterator[list[int]]:
    """Sample this process's RSS on a thread while the block runs; yields [peak] after it."""
    me = psutil.Process()
    peak = [me.memory_info().rss]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.01):
            with contextlib.suppress(psutil.Error):
                peak[0] = max(peak[0], me.memory_info().rss)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield peak
    finally:
        done.set()
        thread.join()
        peak[0] = max(peak[0], me.memory_info().rss)


def measure(fn: Callable[[], Any], stamps: str, mib: int) -> tuple[float, float, float]:
    """(whole call s, return s, peak RSS / size) of one call returning the value."""
    stamp = stamp_file(stamps)
    stamp.unlink(missing_ok=True)
    gc.collect()
    base = psutil.Process().memory_info().rss
    with peak_rss() as peak:
        start = time.perf_counter()
        value = fn()
        elapsed = time.perf_counter() - start
        end = time.time()
    assert value is not None
    ready = float(stamp.read_text())
    del value
    gc.collect()
    return elapsed, end - ready, (peak[0] - base) / (mib << 20)


def main() -> None:
    """Run every case once (after a warm-up) and print the table."""
    import nbddp

    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, nargs="+", default=[100, 1024])
    parser.add_argument("--kinds", nargs="+", default=["tensor", "state_dict"])
    parser.add_argument("--json", metavar="PATH", help="also write the figures there as JSON")
    args = parser.parse_args()
    nbddp.launch(lambda: None, procs=2, output="none")  # warm: forkserver, store support
    stamps = tempfile.mkdtemp(prefix="nbddp-bench-")
    start = time.perf_counter()
    nbddp.launch(lambda: None, procs=2, output="none")
    launch_only = time.perf_counter() - start
    rows = []
    for mib in args.mib:
        for kind in args.kinds:
            cases: list[tuple[str, Callable[[], Any]]] = [
                ("nbddp.launch", functools.partial(nbddp_launch, kind, mib, stamps)),
                (
                    "torch.multiprocessing + SimpleQueue",
                    functools.partial(torch_launch, kind, mib, stamps),
                ),
            ]
            floor = copy_time(kind, mib)
            rows.append((f"{mib} MiB {kind}", "one in-process copy (floor)", None, floor))
            rows[-1] += ((mib << 20) / floor / 1e9, 1.0, None, mib, kind)
            shared = shared_write_time(kind, mib)
            rows.append((f"{mib} MiB {kind}", "one write() into a memfd", None, shared))
            rows[-1] += ((mib << 20) / shared / 1e9, shared / floor, None, mib, kind)
            for name, fn in cases:
                whole, ret, mem = measure(fn, stamps, mib)
                rate = (mib << 20) / ret / 1e9
                row = (f"{mib} MiB {kind}", name, whole, ret, rate, ret / floor, mem, mib, kind)
                rows.append(row)
                print(f"{mib} MiB {kind}, {name}: {whole:.2f}s", flush=True)
    with contextlib.suppress(OSError):
        for p in Path(stamps).iterdir():
            p.unlink()
        os.rmdir(stamps)
    print(f"\nnbddp.launch returning None (the launch itself): {launch_only:.2f} s")
    print(
        "| value | launcher | whole call (s) | return (s) | return GB/s | x floor "
        "| notebook peak RSS / size |\n|---|---|---|---|---|---|---|"
    )
    for value, name, whole, ret, rate, ratio, mem, *_ in rows:
        shown = "" if whole is None else f"{whole:.2f}"
        peak = "" if mem is None else f"{mem:.2f}x"
        print(f"| {value} | {name} | {shown} | {ret:.3f} | {rate:.2f} | {ratio:.2f}x | {peak} |")
    if args.json:
        import benchjson

        columns = (
            "value",
            "launcher",
            "whole call (s)",
            "return (s)",
            "return GB/s",
            "x floor",
            "notebook peak RSS / size",
            "MiB",
            "kind",
        )
        table = benchjson.table("returns", "rank 0's return value, 2 CPU ranks", columns, rows)
        note = f"nbddp.launch returning None (the launch itself): {launch_only:.3f} s"
        benchjson.write(args.json, "results", [table], [note])


if __name__ == "__main__":
    main()
