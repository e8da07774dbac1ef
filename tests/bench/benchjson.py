"""The figures of one bench run as JSON, for ``tests/bench/plot.py`` and the docs.

Contract: ``write(path, bench, tables, notes)`` writes one JSON object::

    {"bench": "launch",                      # the script's name, without .py
     "command": "tests/bench/launch.py --rounds 2",
     "date": "2026-05-01T12:00:00+00:00",    # when the run ended (UTC)
     "machine": {"cpu": ..., "cores": 2, "memory_gib": 23.4, "gpus": [] or [model, ...],
                 "python": "3.11.7", "torch": "2.13.0", "load_average": [1.0, 0.9, 0.8]},
     "tables": [{"name": "warm", "title": "...", "columns": [...], "rows": [[...], ...]}],
     "notes": ["..."]}

Each table is what the script prints, with numbers as numbers (seconds in
columns named ``... (s)``, milliseconds in ``... (ms)``; None where a row
has no figure). ``plot.py`` finds tables by ``name`` and columns by their
names; a bench it does not know is drawn from its tables' first column
(labels) and numeric columns. The machine is described without touching
CUDA (the NVIDIA driver's ``/proc`` files), as nbddp finds GPUs.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

NVIDIA_PROC_DIR = Path("/proc/driver/nvidia/gpus")


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_models() -> list[str]:
    """The model of each GPU the NVIDIA driver lists (none: an empty list)."""
    models = []
    try:
        boards = sorted(NVIDIA_PROC_DIR.iterdir())
    except OSError:
        return []
    for board in boards:
        try:
            info = (board / "information").read_text()
        except OSError:
            continue
        lines = [ln for ln in info.splitlines() if ln.startswith("Model")]
        models.append(lines[0].partition(":")[2].strip() if lines else "unknown NVIDIA GPU")
    return models


def memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / (1 << 20), 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    import torch

    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": memory_gib(),
        "gpus": gpu_models(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def table(
    name: str, title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]
) -> dict[str, Any]:
    """One table of figures (every row as long as ``columns``)."""
    for row in rows:
        if len(row) != len(columns):
            raise ValueError(f"table {name!r}: row {row!r} has not {len(columns)} cells")
    return {"name": name, "title": title, "columns": list(columns), "rows": [list(r) for r in rows]}


def number(text: str) -> float | str:
    """A printed figure (``1,234.5``, ``+3.2``, ``0.97x``) as a number; else the text."""
    try:
        return float(text.replace(",", "").rstrip("x"))
    except ValueError:
        return text


def finite(value: Any) -> Any:
    """``value`` with every NaN or infinity (no figure) as None, as JSON allows."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite(item) for item in value]
    return value


def write(
    path: str | Path, bench: str, tables: Sequence[dict[str, Any]], notes: Sequence[str] = ()
) -> Path:
    """Write the run's JSON to ``path`` (its folder made if needed); returns the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "bench": bench,
        "command": " ".join(["tests/bench/" + Path(sys.argv[0]).name, *sys.argv[1:]]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "tables": finite(list(tables)),
        "notes": list(notes),
    }
    out.write_text(json.dumps(data, indent=1, allow_nan=False) + "\n")
    print(f"figures written to {out}")
    return out
