"""Execute a notebook in a real kernel (nbclient), top to bottom, as a person would.

``run_notebook(path)`` runs every cell of ``path`` in a fresh kernel and returns the
executed notebook. The kernel is ipykernel on this interpreter, whatever kernelspecs the
machine has installed (a user's ``python3`` spec may point at another Python), with this
process's environment (so its nbddp workers carry the test session's leftover marker),
the checkout's root first on ``PYTHONPATH`` (so it imports this checkout's nbddp), and a
fresh temporary working directory. A cell that raises fails the call with nbclient's
``CellExecutionError``, whose message shows the cell and the traceback.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import nbformat
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient
from traitlets import default

from tests.kernel.kernel import rank_block_lines

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"


class ThisInterpreterKernelManager(AsyncKernelManager):
    """Starts ipykernel with ``sys.executable``.

    With no kernel directories to search, jupyter_client falls back to ipykernel's
    built-in ``python3`` spec, whose command is this interpreter.
    """

    @default("kernel_spec_manager")
    def _no_installed_specs(self) -> KernelSpecManager:
        return KernelSpecManager(kernel_dirs=[])


def kernel_env() -> dict[str, str]:
    """This process's environment with the checkout's root first on ``PYTHONPATH``."""
    env = dict(os.environ)
    paths = [str(ROOT), *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env


def run_notebook(
    path: Path, cwd: Path | None = None, timeout: float = 300.0
) -> nbformat.NotebookNode:
    """Execute every cell of ``path`` in a fresh kernel; return the executed notebook.

    ``cwd``: the kernel's working directory (default: a new temporary directory,
    removed afterwards). ``timeout``: seconds allowed for each cell.
    """
    nb = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory(prefix="nbddp-notebook-") as tmp:
        workdir = cwd if cwd is not None else Path(tmp)
        client = NotebookClient(
            nb,
            timeout=int(timeout),
            kernel_name="python3",
            kernel_manager_class=ThisInterpreterKernelManager,
            resources={"metadata": {"path": str(workdir)}},
        )
        client.execute(env=kernel_env())
    return nb


def cell_text(cell: Any) -> str:
    """Everything a code cell showed as text: streams, text/plain results, tracebacks."""
    parts = []
    for output in cell.get("outputs", []):
        if output["output_type"] == "stream":
            parts.append(output["text"])
        elif output["output_type"] in ("execute_result", "display_data"):
            plain = output.get("data", {}).get("text/plain", "")
            # nbddp's per-rank blocks read as the text display's "[rank N] line" lines.
            block = rank_block_lines(plain) if output["output_type"] == "display_data" else None
            parts.append("\n".join(block) + "\n" if block is not None else plain + "\n")
        elif output["output_type"] == "error":
            parts.append("\n".join(output["traceback"]) + "\n")
    return "".join(parts)


def notebook_text(nb: nbformat.NotebookNode) -> str:
    """Everything the notebook's code cells showed as text, in order."""
    return "".join(cell_text(cell) for cell in nb.cells if cell.cell_type == "code")
