"""The panel's widgets without a kernel or a run: the form reads back, devices toggle,
errors sit by their fields, and the cell hook closes panels of re-run or deleted cells."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from nbddp.launcher.devices import VisibleGpus
from nbddp.launcher.events import RankState
from nbddp.launcher.logs import rank_log
from nbddp.notebook.panel import cells
from nbddp.notebook.panel.feed import RankView
from nbddp.notebook.panel.panel import gpu_words
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


def test_both_devices_are_offered_and_a_missing_gpu_is_said_in_plain_words() -> None:
    # A lone toggle reads as disabled: both choices are always there, and the one
    # that cannot be says why (its tooltip, the note beside it, an error if chosen).
    view = PanelView("t", PanelSettings.initial(0), gpu_words(VisibleGpus((), "0 in /proc")))
    assert [value for _, value in view.device.options] == ["gpu", "cpu"]
    assert view.device.value == "cpu"
    assert view.device.tooltips[0] == "No GPU found: runs use CPU processes"
    note = "No GPU found on this machine: runs use CPU processes (gloo)."
    assert note in view.gpus_note.value
    assert "/proc" not in view.gpus_note.value
    view.device.value = "gpu"
    errors = view.settings().validate().errors
    assert "no GPU is visible" in errors["device"]
    view.show_device("gpu")
    assert view._gpu_row.layout.display == "none"  # no empty GPU list
    view.show_errors(errors)
    assert view.gpus_note.layout.display == "none"  # the error says it; no repeat


@pytest.mark.parametrize(
    ("tokens", "source", "words"),
    [
        (
            (),
            "0 in /proc/driver/nvidia/gpus",
            "No GPU found on this machine: runs use CPU processes (gloo).",
        ),
        (
            (),
            "CUDA_VISIBLE_DEVICES=",
            "No GPU visible to this notebook (CUDA_VISIBLE_DEVICES=): "
            "runs use CPU processes (gloo).",
        ),
        (("0",), "1 in /proc/driver/nvidia/gpus", "1 GPU found."),
        (("0", "1"), "torch.cuda", "2 GPUs found."),
        (
            ("1", "3"),
            "CUDA_VISIBLE_DEVICES=1,3",
            "2 GPUs visible to this notebook (CUDA_VISIBLE_DEVICES=1,3).",
        ),
    ],
)
def test_gpu_detection_in_plain_words(tokens: tuple[str, ...], source: str, words: str) -> None:
    assert gpu_words(VisibleGpus(tokens, source)) == words


def test_every_wrong_field_is_flagged_and_counted_on_the_launch_button() -> None:
    view = view_with_gpus(0)
    view.show_errors({"kwargs": "entry 1", "procs": "a whole number", "env": "MASTER_PORT"})
    flagged = [n for n, w in view.inputs.items() if "nbddp-invalid" in w._dom_classes]
    assert flagged == ["kwargs", "procs", "env"]
    assert view.launch_button.description == "Fix 3 fields to launch"
    view.show_errors({"port": "a port number"})
    assert [n for n, w in view.inputs.items() if "nbddp-invalid" in w._dom_classes] == ["port"]
    assert view.launch_button.description == "Fix 1 field to launch"
    view.show_errors({"launch": "Nodes 2 needs a cluster"})
    assert view.launch_button.description == "Fix the settings to launch"
    view.show_errors({})
    assert view.launch_button.description == "Launch"
    assert not any("nbddp-invalid" in w._dom_classes for w in view.inputs.values())


def test_letters_in_the_process_count_stay_and_are_refused_in_words() -> None:
    view = view_with_gpus(0)
    view.procs.value = "two"  # a text field: what was typed is kept, never dropped
    assert view.settings().procs == "two"
    assert "a whole number, e.g. 2" in view.settings().validate().errors["procs"]


def test_a_value_is_shown_short_with_how_to_get_all_of_it() -> None:
    view = view_with_gpus(0)
    view.show_value("{'loss': 0.1}", ["full value: p.value"])
    assert 'rank 0 returned <code class="nbddp-value">{&#x27;loss&#x27;: 0.1}</code>' in (
        view.result.value
    )
    assert "full value: p.value" in view.result.value
    view.show_value("tensor([1,\n 2])", ["full value: p.value"])
    assert '<pre class="nbddp-value"' in view.result.value


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
