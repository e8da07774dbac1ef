"""The panel's widgets without a kernel or a run: the form reads back, devices toggle,
errors sit by their fields, and the cell hook closes panels of re-run or deleted cells."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from nbddp.launcher.events import RankState
from nbddp.launcher.logs import rank_log
from nbddp.notebook.panel import cells
from nbddp.notebook.panel.feed import RankView
from nbddp.notebook.panel.settings import PanelSettings
from nbddp.notebook.panel.view import PanelView


def view_with_gpus(n: int) -> PanelView:
    return PanelView("t", PanelSettings.initial(n), f"GPUs: {n} visible")


def test_the_form_reads_back_what_was_typed() -> None:
    view = view_with_gpus(4)
    view.gpus.value = (1, 2)
    view.port.value = "29600"
    view.env.value = "A=1"
    settings = view.settings()
    assert (settings.device, settings.gpus, settings.port, settings.env) == (
        "gpu",
        (1, 2),
        "29600",
        "A=1",
    )
    assert settings.visible_gpus == 4


def test_gpu_list_or_process_count_whichever_the_device_needs() -> None:
    view = view_with_gpus(2)
    assert [label for label, _ in view.device.options] == ["GPUs", "CPU processes"]
    view.show_device("gpu")
    assert view._gpu_row.layout.display is None and view._procs_row.layout.display == "none"
    view.show_device("cpu")
    assert view._gpu_row.layout.display == "none" and view._procs_row.layout.display is None
    # Without GPUs, CPU is the only choice.
    assert [value for _, value in view_with_gpus(0).device.options] == ["cpu"]


def test_errors_sit_by_their_fields_and_clear() -> None:
    view = view_with_gpus(0)
    view.show_errors({"port": "a port number <1-65535>"})
    assert "a port number &lt;1-65535&gt;" in view.errors["port"].value  # escaped
    assert view.errors["timeout"].value == ""
    view.show_errors({})
    assert all(label.value == "" for label in view.errors.values())


def test_rank_views_fill_table_tabs_and_outputs() -> None:
    view = view_with_gpus(0)
    view.start_run(2)
    ranks = [
        RankView(0, RankState.RUNNING, "3s", "step 1 loss=0.5", ("<b>html</b>",), 0),
        RankView(1, RankState.FAILED, "2s", "", ("a", "b"), 7, rank_log(Path("/logs"), 1)),
    ]
    view.show_ranks(ranks)
    assert view.tabs.titles == ("rank 0 · running", "rank 1 · failed")
    assert '<tr class="nbddp-rank" data-rank="1" data-state="failed">' in view.ranks.value
    assert "&lt;b&gt;html&lt;/b&gt;" in view.tabs.children[0].value
    assert "7 earlier lines are in rank1.log" in view.tabs.children[1].value


class FakeShell:
    def __init__(self, metadata: dict[str, Any]) -> None:
        self.kernel = SimpleNamespace(get_parent=lambda: {"metadata": metadata})


class FakePanel:
    def __init__(self) -> None:
        self.closed = False

    def close(self, wait: bool = True) -> None:
        self.closed = True


def test_rerun_and_deleted_cells_close_their_panels(monkeypatch: pytest.MonkeyPatch) -> None:
    rerun, deleted, other = FakePanel(), FakePanel(), FakePanel()
    monkeypatch.setattr(cells, "_BY_CELL", {"c1": [rerun], "c2": [deleted], "c3": [other]})
    shell = FakeShell({"cellId": "c1", "deletedCells": ["c2"]})
    monkeypatch.setattr(cells, "_kernel_shell", lambda: shell)
    cells._before_cell(SimpleNamespace(cell_id="c1"))
    assert rerun.closed and deleted.closed and not other.closed
    assert list(cells._BY_CELL) == ["c3"]


def test_the_output_tabs_appear_with_a_run() -> None:
    view = view_with_gpus(0)
    assert view.tabs.layout.display == "none"
    view.start_run(2)
    assert view.tabs.layout.display is None and len(view.tabs.children) == 2


def test_without_ipywidgets_the_panel_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    import nbddp

    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # import now fails
    with pytest.raises(ImportError, match=r"pip install 'nbddp\[panel\]' \(or ipywidgets\)"):
        nbddp.panel(lambda: None)
