"""``python -m nbddp.demo``: a real 2-rank DDP run on CPU whose ranks only train.

The ranks receive the digits as tensors and never import scikit-learn;
epochs and metric steps both count from 1; every line about the run comes
before the final summary, which keeps the accuracy the demo has always
reached (0.9467 on 2 CPU ranks).
"""

from __future__ import annotations

import re
import subprocess
import sys
from typing import Any

import nbddp
from nbddp import demo


def train_and_list_sklearn(data: demo.Digits, epochs: int) -> tuple[dict[str, Any], list[str]]:
    """The demo's training, then the scikit-learn modules this rank has imported."""
    result = demo.train(data, epochs, 3e-3, 64)
    return result, sorted(m for m in sys.modules if m == "sklearn" or m.startswith("sklearn."))


def test_ranks_train_on_the_notebooks_tensors_without_importing_sklearn() -> None:
    data = demo.load_data()
    assert "sklearn" in sys.modules  # the notebook side loaded it; the ranks must not
    result, imported = nbddp.launch(train_and_list_sklearn, data, 1, procs=2, output="none")
    assert imported == []
    assert result["world_size"] == 2
    assert 0.0 < result["accuracy"] <= 1.0


def test_the_demo_prints_every_epoch_and_metric_before_its_summary() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "nbddp.demo", "--procs", "2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    *run_lines, summary = proc.stdout.splitlines()
    found = re.fullmatch(r"final test accuracy (\S+) on 2 ranks \(\S+s of training\)", summary)
    assert found, proc.stdout
    assert float(found.group(1)) >= 0.94
    for rank in (0, 1):
        lines = [line for line in run_lines if line.startswith(f"[rank {rank}] ")]
        epochs = [int(m.group(1)) for line in lines if (m := re.search(r"epoch (\d+)/10:", line))]
        steps = [int(m.group(1)) for line in lines if (m := re.search(r"\] step (\d+) ", line))]
        assert epochs == list(range(1, 11)), proc.stdout
        # The display rate-limits metric lines: the first and the last always show.
        assert steps[0] == 1 and steps[-1] == 10, proc.stdout
        assert len(lines) == len(epochs) + len(steps), proc.stdout
