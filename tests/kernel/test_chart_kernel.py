"""The metrics chart in a real kernel: a long 2-rank run sends chart updates of bounded size.

Two CPU ranks log 200,000 steps of three metrics each as fast as they can; the
cell's chart block is redrawn while they run. Every chart update the kernel
sends (its ``text/html`` and ``text/plain``) stays under a fixed size however
many steps came before it, and the last one shows the whole run with axes.
"""

from __future__ import annotations

import json
import re
from typing import Any

from tests.kernel.kernel import Kernel

KERNEL_SETUP = ("import nbddp",)
STEPS = 200_000
UPDATE_BOUND = 32_000
"""Bytes of one chart update's message content (2 ranks x 3 metrics), at any step."""

TRAIN = f"""
def train():
    import math, os
    rank = int(os.environ["RANK"])
    for step in range({STEPS}):
        loss = 2.3 * math.exp(-step / 5000) * (1 + 0.1 * rank) + 0.05
        lr = 1e-3 * 0.5 * (1 + math.cos(math.pi * step / {STEPS}))
        nbddp.log(step=step, loss=loss, lr=lr, acc=1 - loss / 3)
    return rank
run = nbddp.launch(train, procs=2, block=False)
print(f"VALUES={{run.wait().values}}")
print(f"ROWS={{len(run.metrics)}}")
"""


def chart_updates(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The display messages that draw the chart block."""
    return [
        m["content"]
        for m in messages
        if m["msg_type"] in ("display_data", "update_display_data")
        and "nbddp-metrics" in m["content"].get("data", {}).get("text/html", "")
    ]


def test_a_200000_step_run_sends_chart_updates_of_bounded_size(kernel: Kernel) -> None:
    result = kernel.execute(TRAIN, timeout=300)
    assert result.status == "ok", result.text()[-3000:]
    assert f"VALUES={{0: 0, 1: 1}}\nROWS={2 * STEPS}\n" in result.stdout, result.text()[-3000:]
    updates = chart_updates(result.messages)
    sizes = [len(json.dumps(content)) for content in updates]
    print(f"{len(updates)} chart updates, bytes each: {sizes}")
    assert updates
    assert max(sizes) < UPDATE_BOUND, sizes

    final = updates[-1]["data"]
    lines = final["text/plain"].splitlines()
    assert [line.split(":")[0] for line in lines] == ["metrics rank 0", "metrics rank 1"]
    assert all(f": step {STEPS - 1} loss=" in line for line in lines), lines
    html = final["text/html"]
    assert re.findall(r'data-metric="(\w+)"', html) == ["loss", "lr", "acc"]
    assert 'data-scale="log"' in html  # the loss falls over decades
    for label in ("50k", "100k", "150k", ">step<"):
        assert label in html
