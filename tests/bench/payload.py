"""Launching with a large tensor in the payload: time and memory, side by side.

    .venv/bin/python tests/bench/payload.py [--gib 1 4] [--json PATH]

A float32 tensor of each ``--gib`` size is captured in a closure; each of 2 CPU
ranks reads all of it (sums it) and returns. For each launcher: wall time
of the launch (call to return; it includes each rank reading the whole
tensor), the time until every rank's function had started (what the
launcher itself costs), and the peak memory in use on the machine
(``AnonPages + Shmem`` in /proc/meminfo: every process's private pages plus
all shared memory, mapped or not, each page once), sampled every 20 ms,
minus that before the tensor existed, sampling on for ``SETTLE`` seconds after
each launch (the kernel's counts lag); shown as a multiple of the tensor's
size. Run it on a quiet machine: other processes' memory counts too. The
floor is one in-process copy of the tensor (``clone()``); "x (copy + small
launch)" holds the time until every rank runs against that copy plus the
small launch's. Beside it one in-process ``write()`` of the tensor into a memfd:
the least that putting its bytes where the ranks can map them costs, with the
same ratio (that write plus the small launch). ``--json`` also writes the table
to a file (``benchjson``, for ``plot.py``). Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import torch
from results import memfd_write_time

SETTLE = 2.0  # seconds: the kernel folds its per-CPU memory counts into meminfo each second


def in_use() -> int:
    """Bytes of anonymous and shared memory in use on the machine (/proc/meminfo)."""
    fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    return (int(fields["AnonPages"].split()[0]) + int(fields["Shmem"].split()[0])) * 1024


@contextlib.contextmanager
def peak_in_use() -> Iterator[list[int]]:
    """Sample ``in_use`` on a thread while the block runs; yields [peak] after it."""
    peak = [in_use()]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.02):
            peak[0] = max(peak[0], in_use())

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield peak
    finally:
        time.sleep(SETTLE)  # what the block used, counted late, still counts
        done.set()
        thread.join()
        peak[0] = max(peak[0], in_use())


def run_with_deadline(fn: Callable[[], object], deadline: float) -> bool:
    """Run ``fn`` on a thread; past ``deadline``, kill the processes it started (not
    nbddp's forkserver) so that it returns. True if it finished by itself."""

    def call() -> None:
        with contextlib.suppress(Exception):  # a killed launcher raises; the row says so
            fn()

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(deadline)
    if not thread.is_alive():
        return True
    for proc in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if not proc.name().startswith("nbddp-"):
                proc.kill()
    thread.join(30)
    return False


def stamp(stamps: str) -> None:
    """Record, in the directory ``stamps``, when this rank's function started."""
    import os

    with open(os.path.join(stamps, str(os.getpid())), "w") as f:
        f.write(repr(time.time()))


def make_task(data: torch.Tensor, stamps: str) -> Callable[[], float]:
    """A closure over ``data``: every rank notes when it started, then reads all of it."""

    def task() -> float:
        stamp(stamps)
        return float(data.sum())

    return task


def task_with_rank(rank: int, data: torch.Tensor, stamps: str) -> None:
    """torch.multiprocessing's convention: fn(rank, *args)."""
    stamp(stamps)
    float(data.sum())


def last_start(stamps: str) -> float | None:
    """The latest start time the ranks recorded (every rank is running by then)."""
    times = [float(p.read_text()) for p in Path(stamps).iterdir()]
    return max(times) if times else None


def copy_time(data: torch.Tensor) -> float:
    """Seconds for one in-process copy of ``data`` (``clone()``): what any launcher that
    gives the ranks the tensor must at least spend, short of sharing the notebook's pages."""
    start = time.perf_counter()
    copy = data.clone()
    elapsed = time.perf_counter() - start
    del copy
    return elapsed


def run_size(gib: float, deadline: float) -> list[tuple[object, ...]]:
    """Every launcher once with a tensor of ``gib`` GiB; the table's rows."""
    from accelerate import debug_launcher
    from torch.multiprocessing import start_processes

    import nbddp

    gc.collect()  # the last size's tensor, shared in place, lets its memory go at a collection
    time.sleep(SETTLE)
    base = in_use()
    data = torch.ones(int(gib * (1 << 30)) // 4)
    size = data.numel() * 4
    stamps = tempfile.mkdtemp(prefix="nbddp-bench-")
    small = make_task(torch.ones(4), stamps)
    task = make_task(data, stamps)
    floor = copy_time(data)
    time.sleep(SETTLE)  # the copy's memory, freed, counted as freed
    shared = memfd_write_time([data])
    time.sleep(SETTLE)
    cases: list[tuple[str, Callable[[], object]]] = [
        ("nbddp, small payload (reference)", lambda: nbddp.launch(small, procs=2, output="none")),
        (
            "nbddp forkserver, 1st launch (shares it in place)",
            lambda: nbddp.launch(task, procs=2, output="none"),
        ),
        ("nbddp forkserver, next launch", lambda: nbddp.launch(task, procs=2, output="none")),
        ("nbddp spawn", lambda: nbddp.launch(task, procs=2, start_method="spawn", output="none")),
        ("accelerate debug_launcher (fork)", lambda: debug_launcher(task, num_processes=2)),
        (
            "torch.multiprocessing (spawn)",
            lambda: start_processes(
                task_with_rank, args=(data, stamps), nprocs=2, start_method="spawn"
            ),
        ),
    ]
    rows: list[tuple[object, ...]] = []
    small_start = None
    for name, fn in cases:
        for old in Path(stamps).iterdir():
            old.unlink()
        with peak_in_use() as peak:
            wall_start = time.time()
            start = time.perf_counter()
            finished = run_with_deadline(fn, deadline)
            elapsed = time.perf_counter() - start
        started = last_start(stamps)
        to_start = None if started is None else started - wall_start
        if small_start is None:
            small_start = to_start or 0.0
        over = None if to_start is None else to_start / (floor + small_start)
        ratio = (peak[0] - base) / size
        rows.append((f"{gib:g} GiB", name, elapsed if finished else None, to_start, over, ratio))
        print(f"{gib:g} GiB, {name}: {elapsed:.2f}s{'' if finished else ' (hung)'}", flush=True)
    over = (shared + (small_start or 0.0)) / (floor + (small_start or 0.0))
    rows.insert(0, (f"{gib:g} GiB", "one write() into a memfd", shared, shared, over, None))
    rows.insert(0, (f"{gib:g} GiB", "one in-process copy (clone)", floor, floor, None, None))
    shutil.rmtree(stamps, ignore_errors=True)
    return rows


def main() -> None:
    """Run every launcher once per size (after one warm-up) and print the table."""
    import nbddp

    parser = argparse.ArgumentParser()
    parser.add_argument("--gib", type=float, nargs="+", default=[1.0])
    parser.add_argument("--deadline", type=float, default=60.0, help="seconds before a hang")
    parser.add_argument("--json", metavar="PATH", help="also write the figures there as JSON")
    args = parser.parse_args()
    nbddp.launch(lambda: None, procs=2, output="none")  # warm: forkserver, store support
    rows = [row for gib in args.gib for row in run_size(gib, args.deadline)]
    title = "a float32 tensor in a closure, 2 CPU ranks each summing it"
    print(f"\n{title}")
    print(
        "| tensor | launcher | launch to return (s) | launch to every rank running (s) "
        "| x (copy + small launch) | peak memory / tensor size |\n|---|---|---|---|---|---|"
    )
    for gib, name, elapsed, to_start, over, ratio in rows:
        shown = "hung" if elapsed is None else f"{elapsed:.2f}"
        begun = "?" if to_start is None else f"{to_start:.3f}"
        times = "" if over is None else f"{over:.2f}x"
        peak = "" if ratio is None else f"{ratio:.2f}x"
        print(f"| {gib} | {name} | {shown} | {begun} | {times} | {peak} |")
    if args.json:
        import benchjson

        columns = (
            "tensor",
            "launcher",
            "launch to return (s)",
            "launch to every rank running (s)",
            "x (copy + small launch)",
            "peak memory / tensor size",
        )
        note = f"None in launch to return: hung, killed after {args.deadline:g} s"
        benchjson.write(
            args.json, "payload", [benchjson.table("payload", title, columns, rows)], [note]
        )


if __name__ == "__main__":
    main()
