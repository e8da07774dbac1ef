"""Plots of the benches' JSON figures, for the docs' Benchmarks page.

    .venv/bin/python tests/bench/plot.py [JSON ...] [--out docs/assets/bench]

Reads each bench's JSON (``--json PATH`` of launch.py, cell.py, results.py,
payload.py and relay.py; the format is ``benchjson``'s; by default
every ``docs/bench/*.json``) and writes ``<bench>.png`` into ``--out``:

- launch: warm launch time per launcher (log scale), one bar per pause;
- cell: each variant's cell times (box: quartiles, whiskers: 5th-95th percentile);
- results: return throughput (GB/s) per value, nbddp beside torch's queue;
- payload: launch to return and peak memory per launcher;
- relay: throughput into the notebook side, and the paired cost to a training
  loop (speed against the baseline, 1.0: no cost);
- any other bench: each table's numeric columns per row.

Each plot is titled with what was measured, the machine (CPU, cores, GPUs or
none, torch) and the date of the run. Needs matplotlib (docs/requirements.txt).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_JSON = ROOT / "docs" / "bench"
DEFAULT_OUT = ROOT / "docs" / "assets" / "bench"
NBDDP = "#1f6fb4"
OTHER = "#b0b0b0"
HATCHES = ("", "//", "..")  # one per series of bars that share a colour
# relay.py's paired variants, each printing a line per step (the baseline: to a
# block-buffered /dev/null, no nbddp.log).
PAIRED_LABELS = {
    "devnull-line": "print to /dev/null, line-buffered (reference)",
    "relay": "print relayed",
    "log": "nbddp.log alone",
    "relay+log": "print relayed + nbddp.log",
}


def machine_line(data: dict[str, Any]) -> str:
    """``Intel Xeon, 2 cores, no GPU, torch 2.13.0 · 2026-05-01 · load average 1.2 at the end``."""
    m = data.get("machine", {})
    gpus = m.get("gpus") or []
    gpu = f"{len(gpus)}x {gpus[0]}" if gpus else "no GPU"
    load = m.get("load_average") or ["?"]
    return (
        f"{m.get('cpu', '?')}, {m.get('cores', '?')} cores, {gpu}, torch {m.get('torch', '?')}"
        f" · {str(data.get('date', '?'))[:10]} · load average {load[0]} at the end"
    )


def tables(data: dict[str, Any], prefix: str = "") -> list[dict[str, Any]]:
    """The bench's tables whose name starts with ``prefix``."""
    return [t for t in data.get("tables", []) if str(t.get("name", "")).startswith(prefix)]


def column(table: dict[str, Any], name: str) -> list[Any]:
    """One column of ``table`` by its name."""
    i = table["columns"].index(name)
    return [row[i] for row in table["rows"]]


def colour(label: str) -> str:
    """nbddp's bars in blue, the others' in grey."""
    text = str(label)
    ours = text.startswith(("nbddp", "launch()")) or "%%ddp" in text
    return NBDDP if ours else OTHER


def plot_launch(data: dict[str, Any], plt: Any) -> Any:
    found = [t for t in tables(data, "pause") if t["rows"]]
    fig, ax = plt.subplots(
        figsize=(9, 0.6 + 0.45 * max(len(t["rows"]) for t in found) * len(found))
    )
    names = column(found[0], "launcher")
    from matplotlib.patches import Patch

    height = 0.8 / len(found)
    handles = []
    for i, t in enumerate(found):
        medians = dict(zip(column(t, "launcher"), column(t, "median (s)"), strict=True))
        ys = [n + i * height for n in range(len(names))]
        values = [medians.get(name) or 0.0 for name in names]
        hatch = HATCHES[i % len(HATCHES)]
        bars = ax.barh(ys, values, height=height, color=[colour(n) for n in names], hatch=hatch)
        ax.bar_label(bars, labels=[f"{v:.3f} s" for v in values], padding=3, fontsize=8)
        handles.append(Patch(facecolor="white", edgecolor="black", hatch=hatch, label=t["title"]))
    ax.set_yticks([n + height * (len(found) - 1) / 2 for n in range(len(names))], names)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlim(right=ax.get_xlim()[1] * 3)  # room for the labels
    ax.set_xlabel("warm launch, call to return (s, median; log scale)")
    if len(found) > 1:
        ax.legend(handles=handles, title="launches", loc="upper right")
    return fig


def plot_cell(data: dict[str, Any], plt: Any) -> Any:
    t = tables(data, "cells")[0]
    names, times = column(t, "variant"), column(t, "times (ms)")
    fig, ax = plt.subplots(figsize=(9, 0.8 + 0.6 * len(names)))
    box = ax.boxplot(
        times, orientation="horizontal", whis=(5, 95), showfliers=False, patch_artist=True
    )
    for patch, name in zip(box["boxes"], names, strict=True):
        patch.set_facecolor(colour(name))
    medians = column(t, "median (ms)")
    for y, value in enumerate(medians, start=1):
        ax.annotate(
            f"{value:.1f} ms",
            (value, y),
            xytext=(0, 12),
            textcoords="offset points",
            ha="center",
            fontsize=8,
        )
    ax.set_yticks(range(1, len(names) + 1), names)
    ax.invert_yaxis()
    ax.set_xlim(left=0)
    ax.set_xlabel("execute request to reply (ms)")
    return fig


def plot_results(data: dict[str, Any], plt: Any) -> Any:
    t = tables(data, "returns")[0]
    values = list(dict.fromkeys(column(t, "value")))
    launchers = list(dict.fromkeys(column(t, "launcher")))
    rates = {(r[0], r[1]): r[t["columns"].index("return GB/s")] for r in t["rows"]}
    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / len(launchers)
    for i, launcher in enumerate(launchers):
        xs = [n + i * width for n in range(len(values))]
        ys = [rates.get((v, launcher)) or 0.0 for v in values]
        # The references (the copy, the memfd write): hollow, told apart from the peers.
        reference = "floor" in launcher or "memfd" in launcher
        bars = ax.bar(
            xs,
            ys,
            width=width,
            label=launcher,
            color="white" if reference else colour(launcher),
            edgecolor=OTHER,
            hatch=("//" if "floor" in launcher else "..") if reference else None,
        )
        ax.bar_label(bars, labels=[f"{y:.2f}" for y in ys], padding=2, fontsize=8)
    ax.set_xticks([n + width * (len(launchers) - 1) / 2 for n in range(len(values))], values)
    ax.set_ylabel("return throughput (GB/s, higher is better)")
    ax.legend()
    return fig


def plot_payload(data: dict[str, Any], plt: Any) -> Any:
    t = tables(data, "payload")[0]
    names = column(t, "launcher")
    if "tensor" in t["columns"]:  # several sizes: each row names its own
        names = [f"{size}: {name}" for size, name in zip(column(t, "tensor"), names, strict=True)]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 0.8 + 0.55 * len(names)), sharey=True)
    for ax, name, unit in (
        (left, "launch to return (s)", "s"),
        (right, "peak memory / tensor size", "x"),
    ):
        shown = column(t, name)  # None: not measured (the copy's memory) or hung
        values = [v if v is not None else 0.0 for v in shown]
        bars = ax.barh(range(len(names)), values, color=[colour(n) for n in names])
        labels = ["" if v is None else f"{v:.2f} {unit}" for v in shown]
        ax.bar_label(bars, labels=labels, padding=3, fontsize=8)
        ax.set_xlabel(name)
    left.set_yticks(range(len(names)), names)
    left.invert_yaxis()
    return fig


def plot_relay(data: dict[str, Any], plt: Any) -> Any:
    paired = tables(data, "paired")
    through = tables(data, "throughput")
    panels = len(paired) + bool(through)
    fig, axes = plt.subplots(panels, 1, figsize=(10, 0.6 + 2.6 * panels), squeeze=False)
    axes = list(axes[:, 0])
    if through:
        t, ax = through[0], axes.pop(0)
        labels = [
            f"{a}, {b}" for a, b in zip(column(t, "lines"), column(t, "display"), strict=True)
        ]
        values, rates = column(t, "lines/s"), column(t, "MB/s")
        bars = ax.barh(range(len(labels)), values, color=NBDDP)
        shown = [f"{v:,.0f} lines/s, {r:g} MB/s" for v, r in zip(values, rates, strict=True)]
        ax.bar_label(bars, labels=shown, padding=3, fontsize=8)
        ax.set_xlim(right=max(values) * 1.45)
        ax.set_yticks(range(len(labels)), labels)
        ax.invert_yaxis()
        ax.xaxis.set_major_formatter(lambda x, _: f"{x / 1000:,.0f}k")
        ax.set_xlabel("lines/s into the notebook side (2 ranks)")
    for t, ax in zip(paired, axes, strict=True):
        ratios = [c for c in t["columns"] if c.endswith("ratio")]
        rows = column(t, t["columns"][0])[1:]  # the first row is the baseline itself
        names = [PAIRED_LABELS.get(name, name) for name in rows]
        height = 0.8 / len(ratios)
        widest = 1.0
        for i, c in enumerate(ratios):
            ys = [n + i * height for n in range(len(names))]
            values = column(t, c)[1:]
            bars = ax.barh(ys, values, height=height, label=c.replace(" ratio", ""))
            ax.bar_label(bars, labels=[f"{v:.2f}" for v in values], padding=3, fontsize=7)
            widest = max([widest, *values])
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.set_xlim(0, widest * 1.1)  # room for the labels
        ax.set_yticks([n + height * (len(ratios) - 1) / 2 for n in range(len(names))], names)
        ax.invert_yaxis()
        ax.set_xlabel("steps/s against the baseline (1.0: no cost)")
        ax.set_title(
            f"{t['title'].removeprefix('(c) ')}; baseline: print to a block-buffered /dev/null",
            fontsize=9,
        )
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


def plot_other(data: dict[str, Any], plt: Any) -> Any:
    """Any bench: for each table, its numeric columns per row (first column: labels); a
    median's spread (min, max) and count stay in the folded table."""
    shown = []
    for t in data.get("tables", []):
        for c in t["columns"][1:]:
            if c in ("n", "min (s)", "max (s)"):
                continue
            values = column(t, c)
            if values and all(isinstance(v, int | float) or v is None for v in values):
                shown.append((t, c))
    if not shown:
        raise ValueError(f"{data.get('bench')}: no numeric column to plot")
    fig, axes = plt.subplots(len(shown), 1, figsize=(9, 1.2 + 1.6 * len(shown)), squeeze=False)
    for (t, c), ax in zip(shown, axes[:, 0], strict=True):
        labels = [str(x) for x in column(t, t["columns"][0])]
        values = [v if v is not None else 0.0 for v in column(t, c)]
        bars = ax.barh(range(len(labels)), values, color=[colour(x) for x in labels])
        ax.bar_label(bars, labels=[f"{v:.3g}" for v in values], padding=3, fontsize=8)
        ax.set_yticks(range(len(labels)), labels)
        ax.invert_yaxis()
        ax.set_xlabel(f"{t.get('title', t['name'])}: {c}", fontsize=9)
    return fig


PLOTS: dict[str, tuple[str, Callable[[dict[str, Any], Any], Any]]] = {
    "launch": ("Warm launch time, nbddp beside accelerate, torch spawn, torchrunx", plot_launch),
    "cell": ("A trivial cell's latency in a kernel, nbddp beside nbdistributed", plot_cell),
    "results": ("Rank 0's return value: throughput, nbddp beside torch's queue", plot_results),
    "payload": ("A large tensor in the payload: time and memory", plot_payload),
    "relay": ("Relay: throughput, and its cost to a training loop", plot_relay),
}


def plot(path: Path, out: Path) -> Path:
    """Draw one bench's JSON into ``out/<bench>.png``; returns the PNG's path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(path.read_text())
    bench = str(data.get("bench") or path.stem)
    what, draw = PLOTS.get(bench, (f"Bench: {bench}", plot_other))
    if bench == "payload" and tables(data, "payload"):
        what = tables(data, "payload")[0]["title"]
    fig = draw(data, plt)
    fig.suptitle(f"{what}\n{machine_line(data)}", fontsize=10)
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    png = out / f"{bench}.png"
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("json", nargs="*", type=Path, help=f"default: {DEFAULT_JSON}/*.json")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for the PNGs")
    args = parser.parse_args(argv)
    paths = args.json or sorted(DEFAULT_JSON.glob("*.json"))
    if not paths:
        print(f"no JSON given and none in {DEFAULT_JSON}", file=sys.stderr)
        return 1
    for path in paths:
        print(f"{path} -> {plot(path, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
