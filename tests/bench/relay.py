"""Relay benchmark: throughput to the notebook side, and the cost to a training loop.

Run by hand (not collected by pytest)::

    python tests/bench/relay.py [--lines 200000] [--steps 3000] [--repeats 3] [--json PATH]

(a) Throughput: 2 ranks each print ``--lines`` short lines (and, separately,
1 KiB lines) as fast as ``print`` goes. Measured from launch until
``run.wait()`` returns with everything in the logs, minus the same launch
of ranks that print nothing; reported as lines/s and MB/s into the
notebook side, for the text display (what scripts get) and the kernel
display (its rendering, with a publisher that discards the blocks: no
kernel here). The notebook's own stdout is sent to /dev/null while
measuring, so a terminal's speed is not what is measured.

(b) Training-loop cost: each rank runs a small MLP training step on CPU
(a tiny one, about half a millisecond a step, and a wider one),
printing one line and calling ``nbddp.log`` every step, timed inside the
rank (steps/s), launched through nbddp with the text display (and the
kernel display's rendering for the full variant); against the same loop,
same launch, with the rank's stdout on /dev/null and no ``nbddp.log`` (and
the two halves: only the print relayed, only ``nbddp.log``; and, for
reference, the print line-buffered into /dev/null: the system call per
line that a terminal costs too, with no relay at all). Variants are
interleaved, each ``--repeats`` times; the best and the median run are
reported with their ratios to the baseline (on a shared machine the best
run is the least disturbed one). Every figure comes from this one run.

Wall-clock ratios move with whatever else runs on the machine, so (b) also
reports CPU time, which load disturbs much less: each rank's process CPU
per step (its training thread, nbddp's metrics flusher, everything), and
the notebook's process CPU per rank step (relay thread, display, metrics
decoding), both above the baseline's. With as many busy ranks as cores,
every notebook CPU microsecond is taken from a rank, so a step costs about
``base + rank extra + notebook extra``; "cpu model" is the ratio that
predicts, ``base / (base + extras)``, with ``base`` the baseline's
measured wall time per step. A full garbage collection
left due by earlier launches would land in whichever run comes next (the
notebook imports torch: tens of milliseconds), so each launch is preceded
by ``gc.collect()``, outside the timing.

(c) The same costs, paired: separate launches drift (on this 2-core VM one
variant's runs spread by 20%), so in one launch each rank alternates
blocks of ``--block-steps`` steps between the variants (print to a
block-buffered /dev/null, the baseline; a line-buffered /dev/null;
relayed; ``nbddp.log`` alone; relayed print + ``nbddp.log``), ``--blocks``
rounds, and sums each variant's wall time and its training thread's CPU
time. Whatever disturbs the machine then disturbs every variant alike;
the ratio and the extra microseconds per step are reported per rank.

``--json PATH`` also writes every table to a file (``benchjson``, for
``plot.py``): ``paired <hidden>`` for (c), ``throughput`` for (a) and
``training <hidden>`` for (b), figures as numbers.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import nbddp
from nbddp.display.kernel import KernelDisplay
from nbddp.display.text import TextDisplay
from nbddp.launcher.config import LaunchConfig
from nbddp.launcher.job import Job
from nbddp.launcher.pump import Display
from nbddp.launcher.run import Run
from nbddp.wire.payload import Payload

RANKS = 2


# -- rank side ------------------------------------------------------------------


def print_lines(count: int, width: int) -> float:
    """Print ``count`` lines of ``width`` characters (newline included); seconds taken."""
    pad = "x" * max(0, width - 16)
    start = time.perf_counter()
    for i in range(count):
        print(f"{i:>14d} {pad}")
    sys.stdout.flush()
    return time.perf_counter() - start


def process_cpu() -> float:
    """CPU seconds this process has used so far, all threads (exited ones too)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def mlp_step(hidden: int) -> Callable[[], float]:
    """One training step of an MLP (64 -> ``hidden`` -> 10, batch 64) on CPU; its loss."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 64), torch.randint(0, 10, (64,))

    def step() -> float:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        return float(loss.item())

    return step


def train_loop(steps: int, hidden: int, out: str, log: bool) -> tuple[float, float]:
    """An MLP (64 -> ``hidden`` -> 10, batch 64) trained for ``steps`` steps.

    Returns (steps/s, this process's CPU seconds per step), warm-up excluded.

    Every step prints one line to ``out``: "relay" (the rank's stdout),
    "devnull" (/dev/null, block-buffered as a script's redirected stdout) or
    "devnull-line" (/dev/null, line-buffered: a system call per line as on
    a terminal or the relay's pipe). With ``log`` every step also calls
    ``nbddp.log``.
    """
    train_step = mlp_step(hidden)
    if out != "relay":
        # The rank exits after this loop: the file lives as long as it needs to.
        sys.stdout = open(os.devnull, "w", buffering=1 if out == "devnull-line" else -1)  # noqa: SIM115
    warmup = steps // 10
    start = cpu = 0.0
    for step in range(steps + warmup):
        if step == warmup:
            start, cpu = time.perf_counter(), process_cpu()
        value = train_step()
        print(f"step {step} loss {value:.4f}")
        if log:
            nbddp.log(step=step, loss=value)
    sys.stdout.flush()
    return steps / (time.perf_counter() - start), (process_cpu() - cpu) / steps


PAIRED = ("devnull", "devnull-line", "relay", "log", "relay+log")
"""(c)'s variants; the first is the baseline."""


def paired_loop(blocks: int, block_steps: int, hidden: int) -> dict[str, tuple[float, float]]:
    """(c): the training step of ``train_loop``, variants alternating block by block.

    Returns, per variant, (wall seconds, training-thread CPU seconds) summed over
    ``blocks`` rounds of ``block_steps`` steps (a first round, warm-up, not counted).
    """
    train_step = mlp_step(hidden)
    null = open(os.devnull, "w")  # noqa: SIM115 - the rank exits after this loop
    null_line = open(os.devnull, "w", buffering=1)  # noqa: SIM115
    relayed = sys.stdout
    outs = {"devnull": null, "devnull-line": null_line, "relay": relayed, "log": null}
    outs["relay+log"] = relayed
    totals = {name: (0.0, 0.0) for name in PAIRED}
    step = 0
    for round_ in range(blocks + 1):
        for name in PAIRED:
            out, log = outs[name], name.endswith("log")
            wall, cpu = time.perf_counter(), time.thread_time()
            for _ in range(block_steps):
                value = train_step()
                print(f"step {step} loss {value:.4f}", file=out)
                if log:
                    nbddp.log(step=step, loss=value)
                step += 1
            if round_:
                w, c = totals[name]
                totals[name] = (
                    w + time.perf_counter() - wall,
                    c + time.thread_time() - cpu,
                )
    sys.stdout.flush()
    return totals


def paired_cost(blocks: int, block_steps: int, hidden: int) -> list[tuple[str, ...]]:
    _, result = launch(paired_loop, (blocks, block_steps, hidden), text_display())
    steps = blocks * block_steps
    rows: list[tuple[str, ...]] = []
    for name in PAIRED:
        cells = [name]
        for rank in range(RANKS):
            totals = result.values[rank]
            base_wall, base_cpu = totals[PAIRED[0]]
            wall, cpu = totals[name]
            cells += [
                f"{base_wall / wall:.3f}",
                f"{(wall - base_wall) / steps * 1e6:+.1f}",
                f"{(cpu - base_cpu) / steps * 1e6:+.1f}",
            ]
        rows.append(tuple(cells))
    return rows


# -- notebook side -------------------------------------------------------------


class NullPublisher:
    """Renders nowhere: measures the kernel display's own work without a kernel."""

    def show(self, bundle: dict[str, str]) -> Any:
        return None

    def update(self, handle: Any, bundle: dict[str, str]) -> None:
        pass

    def cell(self) -> object:
        return 1


def launch(fn: Callable[..., Any], args: tuple[Any, ...], display: Display) -> tuple[float, Any]:
    """Run ``fn(*args)`` on ``RANKS`` CPU ranks; (wall seconds until all is relayed, result)."""
    config = LaunchConfig.build(procs=RANKS)
    gc.collect()  # see the module docstring
    with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
        start = time.perf_counter()
        job = Job(config.job, Payload.serialize(fn, args, {}))
        job.start()
        result = Run(job.core, display, config).wait()
        elapsed = time.perf_counter() - start
    return elapsed, result


def text_display() -> Display:
    return TextDisplay()


def kernel_display() -> Display:
    return KernelDisplay(publisher=NullPublisher())


def log_bytes(result: Any) -> int:
    return sum(result.log_path(r).stat().st_size for r in range(RANKS))


def throughput(lines: int, repeats: int) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    quiet = [launch(print_lines, (0, 16), text_display())[0] for _ in range(repeats)]
    base = statistics.median(quiet)
    for width, count in ((16, lines), (1024, max(1, lines // 10))):
        for name, make in (("text", text_display), ("kernel", kernel_display)):
            times, size = [], 0
            worker_s: list[float] = []
            for _ in range(repeats):
                elapsed, result = launch(print_lines, (count, width), make())
                times.append(elapsed)
                worker_s.append(max(result.values.values()))
                size = log_bytes(result)
                assert size == RANKS * count * width, "the logs are incomplete"
            net = statistics.median(times) - base
            total = RANKS * count
            rows.append(
                (
                    f"{width} B lines",
                    name,
                    f"{total:,}",
                    f"{statistics.median(times):.3f}",
                    f"{net:.3f}",
                    f"{statistics.median(worker_s):.3f}",
                    f"{total / net:,.0f}",
                    f"{size / net / 1e6:,.1f}",
                )
            )
    print(f"baseline launch of {RANKS} ranks printing nothing: {base:.3f} s (median)")
    return rows


TRAIN_VARIANTS = (
    # (label, where the lines go, nbddp.log, display)
    ("stdout to /dev/null, no nbddp.log (baseline)", "devnull", False, "text"),
    ("print relayed", "relay", False, "text"),
    ("nbddp.log, stdout to /dev/null", "devnull", True, "text"),
    ("print relayed + nbddp.log", "relay", True, "text"),
    ("print relayed + nbddp.log, kernel display", "relay", True, "kernel"),
    ("for reference: print line-buffered to /dev/null", "devnull-line", False, "text"),
)
DISPLAYS = {"text": text_display, "kernel": kernel_display}


def train_cost(steps: int, hidden: int, repeats: int) -> list[tuple[str, ...]]:
    """Each variant ``repeats`` times, interleaved so that machine noise hits all alike."""
    wall: dict[str, list[float]] = {v[0]: [] for v in TRAIN_VARIANTS}
    cpu: dict[str, list[float]] = {v[0]: [] for v in TRAIN_VARIANTS}
    notebook_cpu: dict[str, list[float]] = {v[0]: [] for v in TRAIN_VARIANTS}
    for _ in range(repeats):
        for label, out, log, display in TRAIN_VARIANTS:
            before = process_cpu()
            _, result = launch(train_loop, (steps, hidden, out, log), DISPLAYS[display]())
            notebook_cpu[label].append(process_cpu() - before)
            wall[label].append(statistics.mean(v[0] for v in result.values.values()))
            cpu[label].append(statistics.mean(v[1] for v in result.values.values()))
            if log:
                assert len(result.metrics) == RANKS * (steps + steps // 10)
    base = TRAIN_VARIANTS[0][0]
    base_med, base_best = statistics.median(wall[base]), max(wall[base])
    base_cpu = statistics.median(cpu[base])
    base_notebook = statistics.median(notebook_cpu[base])
    rank_steps = RANKS * (steps + steps // 10)  # warm-up steps print and log too
    rows: list[tuple[str, ...]] = []
    for label, *_ in TRAIN_VARIANTS:
        med, best = statistics.median(wall[label]), max(wall[label])
        rank_extra = statistics.median(cpu[label]) - base_cpu
        notebook_extra = (statistics.median(notebook_cpu[label]) - base_notebook) / rank_steps
        model = (1 / base_med) / (1 / base_med + rank_extra + notebook_extra)
        rows.append(
            (
                label,
                f"{1000 / best:.3f}",
                f"{best:,.0f}",
                f"{best / base_best:.3f}",
                f"{med:,.0f}",
                f"{med / base_med:.3f}",
                f"{base_cpu * 1e6 + rank_extra * 1e6:.1f}",
                f"{rank_extra * 1e6:+.1f}",
                f"{notebook_extra * 1e6:+.1f}",
                f"{model:.3f}",
                " ".join(f"{v:,.0f}" for v in wall[label]),
            )
        )
    return rows


def table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [" | ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    rule = "-+-".join("-" * w for w in widths)
    head = " | ".join(c.rjust(w) for c, w in zip(header, widths, strict=True))
    return "\n".join([head, rule, *lines])


def json_table(
    name: str, title: str, header: tuple[str, ...], rows: list[tuple[str, ...]]
) -> dict[str, Any]:
    """A printed table for ``benchjson``: its figures as numbers."""
    import benchjson

    cells = [[benchjson.number(cell) for cell in row] for row in rows]
    return benchjson.table(name, title, header, cells)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=int, default=200_000, help="short lines per rank")
    parser.add_argument(
        "--steps", type=int, default=3000, help="steps per rank (wide MLP: a fifth)"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--blocks", type=int, default=40, help="(c): rounds of the variants")
    parser.add_argument("--block-steps", type=int, default=50, help="(c): steps per block")
    parser.add_argument("--skip-ab", action="store_true", help="run (c) only")
    parser.add_argument("--json", metavar="PATH", help="also write the figures there as JSON")
    args = parser.parse_args()
    tables: list[dict[str, Any]] = []
    print(f"{os.cpu_count()} CPU cores, {RANKS} ranks, torch threads per rank: OMP default")
    print("load average (1, 5, 15 min) at start: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    launch(print_lines, (10, 16), text_display())  # warm the forkserver

    header = ("variant", *[f"rank {r} {c}" for r in range(RANKS) for c in ("ratio", "wall", "cpu")])
    for hidden in (128, 2048):
        print(
            f"\n(c) paired, in one launch: MLP 64-{hidden}-10, {args.blocks} rounds of "
            f"{args.block_steps} steps per variant and rank"
        )
        rows = paired_cost(args.blocks, args.block_steps, hidden)
        print(table(header, rows))
        title = f"(c) paired, in one launch: MLP 64-{hidden}-10"
        tables.append(json_table(f"paired {hidden}", title, header, rows))
    print(
        "ratio: baseline (print to block-buffered /dev/null) wall / variant wall; wall, cpu:\n"
        "microseconds per step above the baseline (cpu: the rank's training thread)."
    )
    if args.skip_ab:
        if args.json:
            benchjson_write(args.json, tables)
        nbddp.shutdown()
        return

    print("\n(a) relay throughput, 2 ranks -> notebook side (medians)")
    header = ("lines", "display", "total", "wall s", "net s", "rank s", "lines/s", "MB/s")
    rows = throughput(args.lines, args.repeats)
    print(table(header, rows))
    title = "(a) relay throughput, 2 ranks -> notebook side (medians)"
    tables.append(json_table("throughput", title, header, rows))
    print("net s: wall minus the baseline launch; rank s: time the slowest rank spent printing")

    header = (
        "variant",
        "ms/step",
        "best steps/s",
        "ratio",
        "median steps/s",
        "ratio",
        "rank cpu us/step",
        "rank extra",
        "notebook extra",
        "cpu model",
        "runs (steps/s)",
    )
    for hidden, steps in ((128, args.steps), (2048, args.steps // 5)):
        print(
            f"\n(b) training loop: MLP 64-{hidden}-10, batch 64, {RANKS} ranks x {steps} steps, "
            "measured inside each rank"
        )
        rows = train_cost(steps, hidden, args.repeats)
        print(table(header, rows))
        title = f"(b) training loop: MLP 64-{hidden}-10, {RANKS} ranks x {steps} steps"
        tables.append(json_table(f"training {hidden}", title, header, rows))
    print(
        "steps/s: wall clock inside the rank (mean of ranks), best and median of the runs;\n"
        "ms/step: from the best run; rank cpu us/step: the rank process's CPU per step\n"
        "(median); rank extra: that, above the baseline's; notebook extra: the notebook\n"
        "process's CPU per rank step above the baseline's (relay, display, metrics),\n"
        "which the ranks lose with as many busy ranks as cores; cpu model: the ratio\n"
        "those predict, base / (base + rank extra + notebook extra), the figure load\n"
        "disturbs least. Target: ratio >= 0.97 for 'print relayed + nbddp.log'."
    )
    print("load average (1, 5, 15 min) at end: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    if args.json:
        benchjson_write(args.json, tables)
    nbddp.shutdown()


def benchjson_write(path: str, tables: list[dict[str, Any]]) -> None:
    import benchjson

    note = (
        "paired ratio: baseline (print to block-buffered /dev/null) wall / variant wall; "
        "wall, cpu: microseconds per step above the baseline"
    )
    benchjson.write(path, "relay", tables, [note])


if __name__ == "__main__":
    main()
