"""Every notebook in ``notebooks/`` runs top to bottom in a real kernel on 2 CPU ranks.

The notebooks assert inside their own cells that each run really was distributed
(world size 2, gradients synchronised, metrics reduced across ranks), so a cell that
raises fails the test. The checks here add what only the cell outputs show: which
ranks printed what, and the summary line each notebook prints once its asserts passed.
The leftover check (``conftest.py``) runs after each notebook, kernel shut down.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import nbformat
import pytest

from tests.kernel.notebooks import NOTEBOOKS, cell_text, notebook_text, run_notebook

ALL = sorted(NOTEBOOKS.glob("*.ipynb"))
PROVED = "distributed: world size 2, gradients synchronised"


def rank_lines(text: str, rank: int, needle: str) -> list[str]:
    """The lines rank ``rank`` printed that contain ``needle``."""
    return [
        line for line in text.splitlines() if line.startswith(f"[rank {rank}] ") and needle in line
    ]


def check_ddp_plain(nb: nbformat.NotebookNode) -> None:
    text = notebook_text(nb)
    assert "launch: " + PROVED in text
    assert "spawn: " + PROVED in text
    assert "%%ddp: " + PROVED in text
    # Rank 0 prints the reduced loss; both ranks' own output reached the cell.
    assert len(rank_lines(text, 0, "(mean over 2 ranks)")) == 6  # 2 epochs, 3 runs
    assert not rank_lines(text, 1, "(mean over 2 ranks)")
    assert len(rank_lines(text, 1, "rank 1 of 2 done")) == 3
    assert "SyncBatchNorm on CPU: ValueError: SyncBatchNorm layers only work with GPU" in text


def check_accelerate(nb: nbformat.NotebookNode) -> None:
    text = notebook_text(nb)
    assert PROVED in text and "mixed precision bf16" in text
    # accelerator.print writes on the main process only.
    assert len(rank_lines(text, 0, "global_step:")) == 6
    assert not rank_lines(text, 1, "global_step:")


def check_trainer(nb: nbformat.NotebookNode) -> None:
    text = notebook_text(nb)
    assert PROVED in text
    # The Trainer logs from the main process only.
    assert rank_lines(text, 0, "'eval_loss'")
    assert not rank_lines(text, 1, "'eval_loss'")


def check_keras_torch(nb: nbformat.NotebookNode) -> None:
    text = notebook_text(nb)
    assert PROVED in text
    for rank in (0, 1):
        assert len(rank_lines(text, rank, "Epoch ")) == 2


def check_dataloader_workers(nb: nbformat.NotebookNode) -> None:
    text = notebook_text(nb)
    assert PROVED in text
    failed = [cell_text(c) for c in nb.cells if "fail_on_rank=1" in c.source]
    assert len(failed) == 1
    seconds = re.search(
        r"RuntimeError: rank 1 fails mid-epoch \(step 3\) \(after ([\d.]+)s\)", failed[0]
    )
    assert seconds is not None and float(seconds.group(1)) < 60
    assert "all 4 DataLoader workers of both ranks are gone" in text


def check_quickstart(nb: nbformat.NotebookNode) -> None:
    text = notebook_text(nb)
    for rank in (0, 1):
        assert f"[rank {rank}] epoch 20: loss" in text
    accuracies = dict(re.findall(r"accuracy \((.+?)\): ([0-9.]+)", text))
    assert set(accuracies) == {"%%ddp", "nbddp.launch"}, text
    for how, value in accuracies.items():
        assert float(value) > 0.8, f"{how}: accuracy {value}"
    ddp_results = [
        output
        for cell in nb.cells
        if cell.cell_type == "code" and cell.source.startswith("%%ddp")
        for output in cell.get("outputs", [])
        if output["output_type"] == "execute_result"
    ]
    assert ddp_results, "the %%ddp cell's last expression is shown as its result"
    assert "latest run: done" in text


def check_panel(nb: nbformat.NotebookNode) -> None:
    text = notebook_text(nb)
    assert PROVED in text
    # The panel itself is a widget view in the cell's output.
    views = [
        output
        for cell in nb.cells
        if "nbddp.panel(" in cell.source
        for output in cell.get("outputs", [])
        if "application/vnd.jupyter.widget-view+json" in output.get("data", {})
    ]
    assert len(views) == 2, "each nbddp.panel(...) cell shows one panel"
    assert "%%ddp --no-init --procs 2 --out result\nresult = train(epochs=15)" in text
    assert "result = nbddp.launch(train, epochs=15, procs=2)" in text
    assert "stopped: the run was stopped" in text and "{0: 'stopped', 1: 'stopped'}" in text


def check_session(nb: nbformat.NotebookNode) -> None:
    text = notebook_text(nb)
    assert PROVED in text
    # Four %%ddp cells trained the same model: the epochs add up, on the same two ranks.
    assert [line.split(":")[0] for line in rank_lines(text, 0, "epoch ")] == [
        f"[rank 0] epoch {n}" for n in (5, 10, 15, 20)
    ]
    assert not rank_lines(text, 1, "epoch ")
    accuracies = dict(re.findall(r"accuracy after (\d+) epochs: ([0-9.]+)", text))
    assert set(accuracies) == {"10", "20"}, text
    assert all(float(value) > 0.8 for value in accuracies.values()), accuracies
    failed = [cell_text(c) for c in nb.cells if 'train_epochs("5")' in c.source]
    assert len(failed) == 1 and "TypeError: 'str' object cannot be interpreted" in failed[0]
    assert failed[0].rstrip().endswith("(every rank returned to idle: the session keeps its state)")
    tables = re.findall(r"^\s+(\d)\s+(\d+)\s.*\bidle$", text, re.M)
    assert len(tables) == 4 and tables[:2] == tables[2:], tables  # started, then shown
    assert re.search(r"names on rank 0: .*\bmodel\b.*\btrain_epochs\b", text)
    assert "%ddp_session: stopped" in text


def check_fsdp2(nb: nbformat.NotebookNode) -> None:
    assert "FSDP2: " + PROVED + ", every parameter sharded in halves" in notebook_text(nb)


def check_torch_compile(nb: nbformat.NotebookNode) -> None:
    text = notebook_text(nb)
    assert re.search(r"torch\.compile: " + PROVED + r", [1-9]\d* graph\(s\) compiled", text)


def check_lightning_fabric(nb: nbformat.NotebookNode) -> None:
    text = notebook_text(nb)
    assert "Lightning Fabric: " + PROVED + ", no process of its own" in text
    # Lightning joined the group that nbddp's environment describes, once per rank.
    for rank in (0, 1):
        assert len(rank_lines(text, rank, f"Initializing distributed: GLOBAL_RANK: {rank}")) == 1


def check_lightning_trainer(nb: nbformat.NotebookNode) -> None:
    text = notebook_text(nb)
    assert "Lightning Trainer: " + PROVED + ", no process of its own" in text
    for rank in (0, 1):
        assert len(rank_lines(text, rank, f"Initializing distributed: GLOBAL_RANK: {rank}")) == 1
    assert rank_lines(text, 0, "`Trainer.fit` stopped: `max_epochs=2` reached.")


def check_device_mesh(nb: nbformat.NotebookNode) -> None:
    text = notebook_text(nb)
    assert "init_device_mesh: distributed: world size 2, one mesh over both ranks" in text


CHECKS: dict[str, Callable[[nbformat.NotebookNode], None]] = {
    "quickstart": check_quickstart,
    "ddp_plain": check_ddp_plain,
    "accelerate": check_accelerate,
    "trainer": check_trainer,
    "keras_torch": check_keras_torch,
    "dataloader_workers": check_dataloader_workers,
    "panel": check_panel,
    "session": check_session,
    "fsdp2": check_fsdp2,
    "torch_compile": check_torch_compile,
    "lightning_fabric": check_lightning_fabric,
    "lightning_trainer": check_lightning_trainer,
    "device_mesh": check_device_mesh,
}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("path", ALL, ids=[p.stem for p in ALL])
def test_notebook_runs_top_to_bottom(path: Path) -> None:
    nb = run_notebook(path)
    check = CHECKS.get(path.stem)
    if check is not None:
        check(nb)


def test_every_check_names_a_notebook_that_exists() -> None:
    # A renamed notebook must not silently lose its output checks.
    assert set(CHECKS) <= {p.stem for p in ALL}
