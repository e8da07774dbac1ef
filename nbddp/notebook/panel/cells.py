"""Showing panels in a kernel, and closing them with their cell.

``show_panel`` makes a ``Panel``, displays it in the running cell (in a kernel) and remembers the
cell; when that cell runs again or is reported deleted, the old panel is closed and its run
stopped, so re-running a panel cell never leaves a run going unseen. Outside a kernel the panel
is returned without being shown.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from nbddp.entry import KernelShell
from nbddp.entry import kernel_shell as _kernel_shell
from nbddp.launcher.options import LaunchOptions
from nbddp.notebook.panel.panel import Panel

_BY_CELL: dict[str, list[Panel]] = {}
_HOOKED: list[object] = []  # the shell whose pre_run_cell hook is ours


def show_panel(
    fn: Callable[..., object],
    args: tuple[object, ...],
    kwargs: Mapping[str, object],
    options: LaunchOptions | None = None,
) -> Panel:
    """Make the panel, and in a kernel display it and tie it to the running cell."""
    panel = Panel(fn, args, kwargs, options=options)
    shell = _kernel_shell()
    if shell is None:
        return panel
    if shell not in _HOOKED:
        shell.events.register("pre_run_cell", _before_cell)
        _HOOKED.append(shell)
    cell_id = _request_metadata(shell).get("cellId")
    if isinstance(cell_id, str):
        # Several panels may come from one cell; the hook closes them all
        # before that cell's next run.
        _BY_CELL.setdefault(cell_id, []).append(panel)
    panel.show()
    return panel


def close_for_cells(cell_ids: list[str]) -> None:
    """Close the panels shown by these cells (run again, or deleted)."""
    for cell_id in cell_ids:
        for panel in _BY_CELL.pop(cell_id, []):
            panel.close(wait=False)


def _before_cell(info: object) -> None:
    shell = _kernel_shell()
    metadata = _request_metadata(shell) if shell is not None else {}
    ids = [getattr(info, "cell_id", None) or metadata.get("cellId")]
    deleted = metadata.get("deletedCells")
    if isinstance(deleted, list):
        ids += deleted
    close_for_cells([i for i in ids if isinstance(i, str)])


def _request_metadata(shell: KernelShell) -> dict[str, object]:
    """The running execute request's metadata (JupyterLab: cellId, deletedCells)."""
    parent = shell.kernel.get_parent()  # ipykernel 6 and later
    metadata = parent.get("metadata") if isinstance(parent, dict) else None
    return metadata if isinstance(metadata, dict) else {}
