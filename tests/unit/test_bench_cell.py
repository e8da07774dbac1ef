"""The cell benchmark's pure helpers (tests/bench/cell.py: a script, loaded from its file)."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

PATH = Path(__file__).resolve().parents[1] / "bench" / "cell.py"


@pytest.fixture(scope="module")
def cell() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_cell", PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_cell"] = module  # dataclasses look their module up by name
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules["bench_cell"]
    return module


def test_p95_is_the_nearest_rank(cell: ModuleType) -> None:
    times = [float(t) for t in range(1, 21)]  # 20 values: the 19th is the 95th percentile
    assert cell.p95(times) == 19.0
    assert cell.p95(list(reversed(times))) == 19.0
    assert cell.p95([7.0]) == 7.0
    assert cell.p95([float(t) for t in range(1, 31)]) == 29.0  # ceil(28.5) = 29th


@pytest.mark.parametrize(
    "text",
    [
        "rank 0 · done · 0.1s\n0 2.0\nrank 1 · done · 0.1s\n1 2.0\n",  # nbddp's rank blocks
        "[rank 0] 0 2.0\n[rank 1] 1 2.0\n",  # nbddp's text display
        "\n🔹 Rank 0:\n  0\n  2.0\n\n🔹 Rank 1:\n  1\n  2.0\n",  # nbdistributed: a line a write
    ],
)
def test_every_rank_line_is_found_whatever_the_display(cell: ModuleType, text: str) -> None:
    assert cell.missing_ranks(text, 2) == []


def test_a_rank_without_its_line_is_missing(cell: ModuleType) -> None:
    assert cell.missing_ranks("[rank 0] 0 2.0\n", 2) == [1]
    assert cell.missing_ranks("No distributed workers running. Use %dist_init first.", 2) == [0, 1]
    # The world size is part of the line: 2.0 is not what 3 ranks print.
    assert cell.missing_ranks("[rank 0] 0 2.0\n[rank 1] 1 2.0\n[rank 2] 2 2.0\n", 3) == [0, 1, 2]
    # A time in a header is not a rank's line.
    assert cell.missing_ranks("rank 0 · done · 11 2.0s\n", 2) == [0, 1]


def test_failure_line_prefers_the_error(cell: ModuleType) -> None:
    text = "\n🔹 Rank 0:\n  x\n\n❌ Error on Rank 1: bench probe\n"
    assert cell.failure_line(text) == "❌ Error on Rank 1: bench probe"
    assert cell.failure_line("Failed to start distributed workers: boom") == (
        "Failed to start distributed workers: boom"
    )
    assert cell.failure_line("\n  first\nsecond\n") == "first"
    assert cell.failure_line("") == "the cell showed nothing"


def test_verdict_says_met_missed_or_why_not(cell: ModuleType) -> None:
    assert cell.verdict(12.0, 15, " ms", "session") == "session: 12.00 ms; target <= 15 ms: met"
    assert cell.verdict(0.2, 0.15, "x", "ratio") == "ratio: 0.20x; target <= 0.15x: MISSED"
    assert cell.verdict(None, 10, " ms", "extra").startswith("extra: n/a")
    assert cell.verdict(math.nan, 10, " ms", "extra").startswith("extra: n/a")


def test_only_picks_variants_by_word(cell: ModuleType) -> None:
    assert cell.chooser(None)("session %%ddp")
    assert cell.chooser(["session"])("session %%ddp")
    assert not cell.chooser(["session"])("nbdistributed %%distributed")


def test_a_setup_cell_that_printed_its_failure_is_caught(cell: ModuleType) -> None:
    failed = "Starting 2 distributed workers...\nFailed to start distributed workers: boom\n"
    assert cell.SETUP_FAILED.search(failed)
    assert cell.SETUP_FAILED.search("❌ Error: no workers")
    # A word in passing is not a failure: a session's banner may mention errors.
    assert not cell.SETUP_FAILED.search("session: 2 ranks; an error ends the cell, not the session")
