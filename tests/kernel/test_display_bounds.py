"""What a rank writes cannot flood the frontend or break a run, in a real kernel.

A 50 MB line without a newline, cursor moves to column 10**12 and metric
values no display can format: the cell ends in seconds, sends a bounded
amount to the frontend, the ranks end, and each rank's log keeps every byte.
"""

from __future__ import annotations

import json
import re
import time

from tests.kernel.kernel import CellResult, Kernel

KERNEL_SETUP = ("import nbddp",)
LINE_BYTES = 50_000_000


def sent_bytes(result: CellResult) -> int:
    """Bytes of message content the cell sent to the frontend (its iopub messages)."""
    return sum(len(json.dumps(m["content"])) for m in result.messages)


def printed(result: CellResult, key: str) -> str:
    match = re.search(rf"^{key}=(.*)$", result.stdout, re.MULTILINE)
    assert match, result.text()[-2000:]
    return match.group(1)


def test_a_50mb_line_without_newline_is_shown_bounded_and_logged_whole(kernel: Kernel) -> None:
    start = time.monotonic()
    result = kernel.execute(
        f"""
def one_long_line():
    import os, sys
    if os.environ["RANK"] == "0":
        sys.stdout.write("0123456789" * {LINE_BYTES // 10})
        sys.stdout.flush()
run = nbddp.launch(one_long_line, procs=2, block=False)
run.wait()
log = (run.log_dir / "rank0.log").read_bytes()
print(f"LOGGED={{len(log)}} {{log == b'0123456789' * {LINE_BYTES // 10}}}")
print(f"LOG={{run.log_dir / 'rank0.log'}}")
""",
        timeout=600,
    )
    seconds = time.monotonic() - start
    sent = sent_bytes(result)
    print(f"50 MB line: cell {seconds:.1f} s, {sent:,} bytes in {len(result.messages)} messages")
    assert result.status == "ok", result.text()[-2000:]
    assert printed(result, "LOGGED") == f"{LINE_BYTES} True"
    assert seconds < 60, f"the cell took {seconds:.1f} s"
    assert sent < 1_000_000, f"{sent:,} bytes sent to the frontend"
    blocks = [
        m["content"]["data"]["text/plain"]
        for m in result.of_type("display_data", "update_display_data")
    ]
    final = [b for b in blocks if b.startswith("rank 0 · done")][-1]
    shown = final.splitlines()[1]
    assert shown.startswith("0123456789" * 10)
    # The cut line says how much more there is, and where.
    assert shown.endswith(f"… {LINE_BYTES - 1000:,} more characters in {printed(result, 'LOG')}")


def test_hostile_cursor_moves_and_metric_values_leave_the_run_whole(kernel: Kernel) -> None:
    result = kernel.execute(
        """
def hostile():
    import sys
    print("a\\x1b[1000000000000Cb")
    print("c\\x1b[10000000Cd")
    print("e\\x1b[" + "9" * 5000 + "Gf")
    nbddp.log(step=1, big=10**400)
    nbddp.log(step=10**5000, huge=10**5000, nan=float("nan"), inf=float("inf"))
    sys.stdout.flush()
    return "finished"
run = nbddp.launch(hostile, procs=2, block=False)
result = run.wait()
print(f"STATUS={run.status} {result.values}")
print(f"ROWS={len(result.metrics)}")
""",
        timeout=120,
    )
    assert result.status == "ok", result.text()[-3000:]
    assert printed(result, "STATUS") == "done {0: 'finished', 1: 'finished'}"
    assert printed(result, "ROWS") == "4"
    assert sent_bytes(result) < 200_000
    assert "display failed" not in result.stderr, result.stderr
