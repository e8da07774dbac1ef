"""The live display in a real kernel: bounded updates, tqdm in place, metrics, output modes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.kernel.kernel import CellResult, Kernel

KERNEL_SETUP = ("import nbddp",)
DISPLAY_MESSAGES = ("display_data", "update_display_data")


def final_blocks(result: CellResult) -> dict[str, dict[str, str]]:
    """Each display id's last content, in the order the blocks were first shown."""
    blocks: dict[str, dict[str, str]] = {}
    for msg in result.of_type(*DISPLAY_MESSAGES):
        blocks[msg["content"]["transient"]["display_id"]] = msg["content"]["data"]
    return blocks


def rank_blocks(result: CellResult) -> dict[int, str]:
    """Rank -> the final text/plain of its block."""
    found: dict[int, str] = {}
    for data in final_blocks(result).values():
        match = re.match(r"rank (\d+) ", data["text/plain"])
        if match:
            found[int(match.group(1))] = data["text/plain"]
    return found


def printed(result: CellResult, key: str) -> str:
    match = re.search(rf"^{key}=(.*)$", result.stdout, re.MULTILINE)
    assert match, result.text()
    return match.group(1)


def test_flood_of_100k_lines_gives_bounded_updates_and_a_complete_log(kernel: Kernel) -> None:
    result = kernel.execute(
        """
def flood():
    import os
    if os.environ["RANK"] == "0":
        for i in range(100_000):
            print(f"line {i}")
run = nbddp.launch(flood, procs=2, block=False)
run.wait()
print(f"LOG={run.log_dir / 'rank0.log'}")
"""
    )
    assert result.status == "ok", result.text()
    updates = len(result.of_type(*DISPLAY_MESSAGES))
    assert updates < 200, f"{updates} display messages for one run"
    assert len(result.stdout) < 1000  # the lines did not go through the stream
    log = Path(printed(result, "LOG")).read_text().splitlines()
    assert log == [f"line {i}" for i in range(100_000)]
    blocks = rank_blocks(result)
    assert blocks[0].startswith("rank 0 · done")
    assert blocks[0].endswith("line 99999")
    assert "99,960 earlier lines in" in blocks[0]


def test_tqdm_ends_as_one_bar_line_per_rank(kernel: Kernel) -> None:
    pytest.importorskip("tqdm")
    result = kernel.execute(
        """
def bars():
    from tqdm import tqdm
    total = 0
    for i in tqdm(range(1000), mininterval=0.01):
        total += sum(range(20_000))  # about half a second in all
    return total
nbddp.launch(bars, procs=2)
"""
    )
    assert result.status == "ok", result.text()
    blocks = rank_blocks(result)
    assert sorted(blocks) == [0, 1]
    for text in blocks.values():
        body = text.splitlines()[1:]
        assert len(body) == 1, text
        assert re.match(r"100%\|█+\| 1000/1000 \[", body[0]), text
    # Every intermediate state too held one bar line, redrawn in place.
    states = [m["content"]["data"]["text/plain"] for m in result.of_type(*DISPLAY_MESSAGES)]
    assert all(state.count("/1000 [") <= 1 for state in states)


def test_metrics_history_chart_and_header(kernel: Kernel) -> None:
    pytest.importorskip("pandas")
    result = kernel.execute(
        """
def train():
    for step in range(30):
        nbddp.log(step=step, loss=1.0 / (step + 1))
    return "ok"
run = nbddp.launch(train, procs=2, block=False)
result = run.wait()
frame = result.metrics.to_pandas()
print(f"ROWS={len(run.metrics)}")
print(f"COLUMNS={list(frame.columns)}")
print(f"RANKS={sorted(set(frame['rank']))}")
"""
    )
    assert result.status == "ok", result.text()
    assert printed(result, "ROWS") == "60"
    assert printed(result, "COLUMNS") == "['rank', 'step', 'time', 'loss']"
    assert printed(result, "RANKS") == "[0, 1]"
    blocks = list(final_blocks(result).values())
    chart = blocks[-1]
    assert "<svg" in chart["text/html"]
    assert chart["text/plain"].splitlines() == [
        "metrics rank 0: step 29 loss=0.03333",
        "metrics rank 1: step 29 loss=0.03333",
    ]
    assert rank_blocks(result)[1].startswith("rank 1 · done · ")
    assert rank_blocks(result)[1].endswith(" · step 29 loss=0.03333")


def test_a_background_run_is_shown_in_its_own_cell_and_wait_shows_only_the_result(
    kernel: Kernel,
) -> None:
    first = kernel.execute(
        """
def early():
    print("said before anyone waited")
    return 7
run = nbddp.launch(early, procs=2, block=False)
assert run.ended(60)
"""
    )
    assert first.status == "ok", first.text()
    assert first.of_type("display_data")  # the blocks, drawn in the launching cell
    second = kernel.execute("run.wait().values")
    assert second.status == "ok", second.text()
    assert not second.of_type(*DISPLAY_MESSAGES)  # no second copy of the blocks
    assert second.result == "{0: 7, 1: 7}"


@pytest.mark.parametrize(("output", "shown"), [("rank0", {0}), ("none", set())])
def test_output_modes_show_headers_and_log_everything(
    kernel: Kernel, output: str, shown: set[int]
) -> None:
    result = kernel.execute(
        f"""
def talk():
    import os
    print("hello from", os.environ["RANK"])
run = nbddp.launch(talk, procs=2, output={output!r}, block=False)
run.wait()
print("OUT=" + repr([run.output(r) for r in range(2)]))
"""
    )
    assert result.status == "ok", result.text()
    blocks = rank_blocks(result)
    for rank in (0, 1):
        lines = blocks[rank].splitlines()
        assert lines[0].startswith(f"rank {rank} · done")
        assert lines[1:] == ([f"hello from {rank}"] if rank in shown else [])
    assert printed(result, "OUT") == "['hello from 0\\n', 'hello from 1\\n']"


def test_last_words_before_a_crash_are_shown(kernel: Kernel) -> None:
    result = kernel.execute(
        """
def crash():
    import os, sys
    if os.environ["RANK"] == "1":
        sys.stdout.write("last words, no newline")
        sys.stdout.flush()
        os._exit(3)
nbddp.launch(crash, procs=2)
"""
    )
    assert result.status == "error"
    blocks = rank_blocks(result)
    assert blocks[1].startswith("rank 1 · exited with code 3 · ")
    assert blocks[1].endswith("last words, no newline")
