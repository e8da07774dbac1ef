"""Warm launch latency, nbddp side by side with the alternatives, in one run.

    .venv/bin/python tests/bench/launch.py [--reps 7] [--pause 1 0] [--rounds 1]
        [--only NAME ...] [--procs 2] [--first-reps 3] [--think 3] [--json PATH]

The task on each of ``--procs`` CPU ranks (2 by default): initialise a gloo process group, one
all_reduce, return. Every launcher runs it in series of ``--reps`` launches
after one warm-up launch, for each ``--pause``: seconds between launches
(not timed), as a notebook user launches (time in which nbddp's forkserver
refills its pool of idle workers), and 0: back to back, as a sweep's loop
does. ``--rounds`` repeats every series, launchers and pauses in turn (the
order reversed each round), so that a noisy machine's slow spells fall on
all of them alike. The table shows, per pause, the median and best wall time
from the call to its return over all rounds, the spread of the rounds'
medians, and each launcher's median as a ratio of nbddp's default
(forkserver with its pool) and of accelerate's ``debug_launcher``, both
measured in the same run. ``--only`` keeps the launchers whose names contain
one of the words given; ``--json`` also writes the tables to a file
(``benchjson``, for ``plot.py``). The series start once nbddp's forkserver has
finished starting (``settle_forkserver``), as it has in a notebook by the
first launch. First, ``--first-reps`` fresh interpreters (0: none)
each import nbddp, wait ``--think`` seconds (the background prewarm's head
start) and time their first launch: interactive ones (``python -i``, as a
notebook's kernel is: nbddp warms up its launch machinery there too), then
scripts. Not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch
import torch.distributed as dist


def task() -> float:
    """The measured work: join the group (unless the launcher did), all_reduce, return.

    The group is not destroyed: accelerate's debug_launcher deletes its FileStore's
    file itself afterwards, which fails if the ranks destroyed the group first."""
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    return float(t.item())


def task_with_rank(rank: int, world_size: int, port: int) -> None:
    """torch.multiprocessing's convention: the function sets up the group itself, and
    destroys it at the end as the DDP tutorial's ``cleanup()`` does. Without it, a rank
    sometimes aborted at exit in this bench (SIGABRT, "terminate called without an
    active exception", the message of a C++ thread destroyed while still running),
    failing the row in 4 of 7 runs of this bench; with it, 0 of 4 failed. (Alone,
    outside this bench, 20 launches each way all passed.)"""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    t = torch.ones(1)
    dist.all_reduce(t)
    dist.destroy_process_group()


def task_in_group() -> float:
    """torchrunx initialises the group before calling the function."""
    t = torch.ones(1)
    dist.all_reduce(t)
    return float(t.item())


def launchers(procs: int) -> dict[str, Callable[[], object]]:
    """Name -> a call that runs the task once on ``procs`` ranks and returns when done."""
    import nbddp
    from nbddp.launcher.ports import choose_port

    def forkserver(pool: str | None) -> Callable[[], object]:
        def call() -> object:
            before = os.environ.pop("NBDDP_POOL", None)
            if pool is not None:
                os.environ["NBDDP_POOL"] = (
                    pool  # read at each launch (forkserver_link.pool_request)
                )
            try:
                return nbddp.launch(task, procs=procs, output="none")
            finally:
                os.environ.pop("NBDDP_POOL", None)
                if before is not None:
                    os.environ["NBDDP_POOL"] = before

        return call

    out: dict[str, Callable[[], object]] = {
        "nbddp (forkserver, pool)": forkserver(None),
        "nbddp (forkserver, no pool)": forkserver("0"),
        "nbddp (fork)": lambda: nbddp.launch(task, procs=procs, start_method="fork", output="none"),
        "nbddp (spawn)": lambda: nbddp.launch(
            task, procs=procs, start_method="spawn", output="none"
        ),
    }
    from accelerate import debug_launcher

    out["accelerate debug_launcher (fork)"] = lambda: debug_launcher(task, num_processes=procs)
    from torch.multiprocessing import start_processes

    out["torch.multiprocessing (spawn)"] = lambda: start_processes(
        task_with_rank,
        args=(procs, choose_port("127.0.0.1", None, fallback=True)[0]),
        nprocs=procs,
        start_method="spawn",
    )
    import logging

    import torchrunx

    logging.getLogger("torchrunx").setLevel(logging.ERROR)
    trx = torchrunx.Launcher(hostnames=["localhost"], workers_per_host=procs, backend="gloo")
    trx.set_logging_handlers(None)
    out["torchrunx"] = lambda: trx.run(task_in_group)
    return out


def settle_forkserver(timeout: float = 60.0) -> None:
    """Wait until nbddp's forkserver, started by ``import nbddp``, has done its start-up
    work: its preload, then filling its pool.

    Why: this bench measures warm launches, and in a notebook the import cell runs
    seconds before the first launch, so by then it is all done. The first launch
    itself, seconds after import, is what ``--first-reps`` measures."""
    import psutil

    from nbddp.launcher.forkserver_link import FORKSERVER, first_pool

    FORKSERVER.prewarm()
    size, _ = first_pool(os.environ)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid = FORKSERVER.pid
        if pid is None:
            return
        idle = [
            p
            for p in psutil.Process(pid).children(recursive=True)
            if p.name() == "nbddp-idle" and p.status() != psutil.STATUS_ZOMBIE
        ]
        # Each free keeper and its idle worker are both named so, once it is warm.
        if len(idle) >= 2 * size:
            return
        time.sleep(0.05)  # a poll of a process listing, not a synchronisation of ours


def measure(fn: Callable[[], object], reps: int, pause: float) -> list[float]:
    """Wall times of ``reps`` calls after one warm-up call, ``pause`` seconds apart."""
    fn()
    times = []
    for _ in range(reps):
        time.sleep(pause)
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def first_launch_child(think: float) -> None:
    """In a fresh interpreter: ``import nbddp``, let ``think`` seconds pass (the user
    writing the next cell, while the background prewarm runs), then print the time of
    the first launch."""
    import nbddp

    time.sleep(think)  # the user's pause before launching, not a synchronisation
    start = time.perf_counter()
    nbddp.launch(task, procs=2, output="none")
    print(f"FIRST {time.perf_counter() - start:.4f}")


def first_launches(reps: int, think: float, interactive: bool) -> list[float]:
    """Times of the first launch after import, each in a fresh interpreter."""
    times = []
    for _ in range(reps):
        proc = subprocess.run(
            [sys.executable, *["-i"] * interactive, __file__, "--first-child", str(think)],
            stdin=subprocess.DEVNULL,  # the interactive one's prompt reads EOF and exits
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("FIRST "))
        times.append(float(line.split()[1]))
    return times


def series(
    calls: dict[str, Callable[[], object]], reps: int, pauses: list[float], rounds: int
) -> dict[tuple[str, float], list[list[float]]]:
    """(launcher, pause) -> each round's wall times; a launcher that fails is left out."""
    out: dict[tuple[str, float], list[list[float]]] = {}
    failed: set[str] = set()
    plan = [(name, pause) for pause in pauses for name in calls]
    for round_ in range(rounds):
        for name, pause in plan if round_ % 2 == 0 else reversed(plan):
            if name in failed:
                continue
            try:
                out.setdefault((name, pause), []).append(measure(calls[name], reps, pause))
            except Exception as exc:  # keep the other rows when one launcher fails here
                print(f"{name}: failed: {type(exc).__name__}: {exc}", file=sys.stderr)
                failed.add(name)
                out.pop((name, pause), None)
    return {key: times for key, times in out.items() if key[0] not in failed}


def rows_of(
    results: dict[tuple[str, float], list[list[float]]], pause: float
) -> list[list[object]]:
    """One pause's rows: launcher, median, best, the rounds' lowest and highest median,
    and the median as a ratio of nbddp's default and of accelerate's (seconds)."""
    stats = []
    for (name, row_pause), rounds in results.items():
        if row_pause != pause:
            continue
        flat = [t for times in rounds for t in times]
        per_round = [statistics.median(times) for times in rounds]
        stats.append((name, statistics.median(flat), min(flat), min(per_round), max(per_round)))
    if not stats:
        return []
    base = stats[0][1]
    anchor = next((med for name, med, *_ in stats if name.startswith("accelerate")), math.nan)
    return [[*row, row[1] / base, row[1] / anchor] for row in stats]


COLUMNS = (
    "launcher",
    "median (s)",
    "best (s)",
    "rounds' lowest median (s)",
    "rounds' highest median (s)",
    "median / nbddp",
    "median / accelerate",
)


def table(rows: list[list[object]], pause: float) -> None:
    """Print the rows of one pause (see ``rows_of``)."""
    if not rows:
        return
    print(f"\n{'back to back' if pause == 0 else f'{pause:g} s apart'}:")
    print(
        "| launcher | median (s) | best (s) | rounds' medians (s) "
        "| median / nbddp | median / accelerate |\n|---|---|---|---|---|---|"
    )
    for name, med, best, lo, hi, to_base, to_anchor in rows:
        print(
            f"| {name} | {med:.3f} | {best:.3f} | {lo:.3f}-{hi:.3f} "
            f"| {to_base:.2f}x | {to_anchor:.2f}x |"
        )


def write_json(
    path: str,
    args: argparse.Namespace,
    tables: dict[float, list[list[object]]],
    first: dict[bool, list[float]],
) -> None:
    """The tables as JSON (``benchjson``): one per pause, and the first launches."""
    import benchjson

    out = [
        benchjson.table(
            f"pause {pause:g}",
            "back to back" if pause == 0 else f"{pause:g} s apart",
            COLUMNS,
            rows,
        )
        for pause, rows in tables.items()
    ]
    out.append(
        benchjson.table(
            "first",
            f"first launch {args.think:g} s after import nbddp, a fresh interpreter each",
            ("how", "times (s)"),
            [["interactive" if how else "script", times] for how, times in first.items()],
        )
    )
    note = (
        f"warm launch, {args.procs} CPU ranks, gloo init + all_reduce; {args.rounds} round(s) "
        f"of {args.reps} reps per launcher and pause"
    )
    benchjson.write(path, "launch", out, [note])


def main() -> None:
    """Run every launcher and print the side-by-side tables."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument(
        "--pause", type=float, nargs="+", default=[1.0, 0.0], help="seconds between launches"
    )
    parser.add_argument("--rounds", type=int, default=1, help="series per launcher and pause")
    parser.add_argument("--only", nargs="+", help="launchers whose names contain one of these")
    parser.add_argument("--procs", type=int, default=2, help="ranks per launch")
    parser.add_argument("--first-reps", type=int, default=3, help="first launches after import")
    parser.add_argument("--think", type=float, default=3.0, help="seconds from import to launch")
    parser.add_argument("--json", metavar="PATH", help="also write the figures there as JSON")
    parser.add_argument("--first-child", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.first_child is not None:
        first_launch_child(args.first_child)
        return
    first = {how: first_launches(args.first_reps, args.think, how) for how in (True, False)}
    calls = {
        name: call
        for name, call in launchers(args.procs).items()
        if not args.only or any(word in name for word in args.only)
    }
    if any(name.startswith("nbddp") for name in calls):
        settle_forkserver()
    results = series(calls, args.reps, args.pause, args.rounds)
    print(
        f"\nwarm launch, {args.procs} CPU ranks, gloo init + all_reduce; {args.rounds} round(s) of "
        f"{args.reps} reps per launcher and pause, {os.cpu_count()} cores"
    )
    tables = {pause: rows_of(results, pause) for pause in args.pause}
    for pause, rows in tables.items():
        table(rows, pause)
    for interactive, times in first.items():
        if times:
            how = "interactive" if interactive else "script"
            print(
                f"first launch {args.think:g} s after `import nbddp` ({how}, fresh each): "
                + ", ".join(f"{t:.3f}" for t in times)
                + f" s; median {statistics.median(times):.3f} s"
            )
    if args.json:
        write_json(args.json, args, tables, first)


if __name__ == "__main__":
    main()
