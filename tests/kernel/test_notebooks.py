"""The example notebooks run top to bottom in a real kernel (nbclient) and do what they say."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


def run_notebook(path: Path) -> nbformat.NotebookNode:
    """Execute ``path`` in a fresh kernel of this interpreter; return the executed notebook."""
    nb = nbformat.read(path, as_version=4)
    km = KernelManager(kernel_name="python3")
    # This interpreter (the test venv, and PYTHONPATH's nbddp), whatever kernelspec is installed.
    km.kernel_cmd = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    client = NotebookClient(
        nb, km=km, timeout=120, resources={"metadata": {"path": str(path.parent)}}
    )
    client.execute()
    return nb


def outputs_text(nb: nbformat.NotebookNode) -> str:
    parts = []
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            if output["output_type"] == "stream":
                parts.append(output["text"])
            elif "data" in output:
                prefix = "Out: " if output["output_type"] == "execute_result" else ""
                parts.append(prefix + output["data"].get("text/plain", "") + "\n")
    return "".join(parts)


def test_quickstart_trains_with_ddp_and_with_launch() -> None:
    text = outputs_text(run_notebook(NOTEBOOKS / "quickstart.ipynb"))
    for rank in (0, 1):
        assert f"[rank {rank}] epoch 20: loss" in text
    accuracies = dict(re.findall(r"accuracy \((.+?)\): ([0-9.]+)", text))
    assert set(accuracies) == {"%%ddp", "nbddp.launch"}, text
    for how, value in accuracies.items():
        assert float(value) > 0.8, f"{how}: accuracy {value}"
    assert re.search(r"^Out: 0\.\d+$", text, re.MULTILINE)  # the %%ddp cell's last value
    assert "latest run: done" in text
