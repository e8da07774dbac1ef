"""The panel in a real JupyterLab, clicked in headless Chromium (Playwright).

Each test writes a notebook into the lab's root, opens it, runs every cell
through JupyterLab's own command, and then works the panel as a person
would: typing into fields, clicking Launch and Stop, re-running a cell.
It waits on the ``data-state`` attributes the panel renders, never on time.
Screenshots land in ``artifacts_dir()`` (printed at the end of the run).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psutil
import pytest
from playwright.sync_api import Page, expect

from tests.browser.lab import KERNEL_IDLE, MS, Lab, artifacts_dir, write_notebook
from tests.procs import ours, wait_procs_gone

pytestmark = pytest.mark.timeout(300)

TRAIN = """\
import os, threading
import nbddp


def train(steps, delay):
    for i in range(steps):
        print(f"step {i} on rank {os.environ['RANK']}", flush=True)
        nbddp.log(step=i, loss=1.0 / (i + 1), acc=i / steps)
        threading.Event().wait(delay)
    return int(os.environ["RANK"])
"""


def open_and_run(page: Page, lab: Lab, name: str, sources: list[str]) -> None:
    """Write the notebook, open it, wait for its kernel, run every cell."""
    write_notebook(lab.root / name, sources)
    page.goto(lab.notebook_url(name))
    page.wait_for_function(KERNEL_IDLE, timeout=90 * MS)
    page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")


def run_cell(page: Page, index: int) -> None:
    """Run one cell again, as Shift+Enter on it would."""
    page.evaluate(
        """(index) => {
            const notebook = window.jupyterapp.shell.currentWidget.content;
            notebook.activeCellIndex = index;
            return window.jupyterapp.commands.execute('notebook:run-cell');
        }""",
        index,
    )


def shot(page: Page, name: str) -> None:
    path = artifacts_dir() / name
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")


@contextmanager
def shot_on_failure(page: Page, name: str) -> Iterator[None]:
    """Screenshot the page as it is when the block fails (then re-raise)."""
    try:
        yield
    except BaseException:
        shot(page, name)
        raise


def retype(field: Any, text: str) -> None:
    """Replace a field's text as a person would: select all, type, move on."""
    field.click()
    field.press("Control+a")
    field.press("Backspace")
    field.press_sequentially(text)
    field.press("Tab")


def ranks_running() -> list[psutil.Process]:
    return [p for p in ours() if p.name().startswith("nbddp-rank")]


@pytest.fixture
def viewport() -> dict[str, int]:
    return {"width": 1280, "height": 1500}


@pytest.fixture
def page(page: Page) -> Page:
    """The page, allowed to read and write the clipboard."""
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    return page


def test_panel_launches_two_cpu_ranks_to_done_with_a_chart(page: Page, lab_server: Lab) -> None:
    open_and_run(page, lab_server, "panel_done.ipynb", [TRAIN, "nbddp.panel(train, 30, 0.02)"])
    panel = page.locator(".nbddp-panel")
    expect(panel).to_have_count(1, timeout=60 * MS)
    launch = panel.locator("button.nbddp-launch")
    procs = panel.locator(".nbddp-field-procs input")

    # An invalid count is refused next to the field, and Launch stays disabled.
    procs.fill("0")
    procs.press("Enter")
    expect(panel.locator(".nbddp-error-procs")).to_contain_text("from 1 to 256")
    expect(launch).to_be_disabled()
    shot(page, "panel-invalid.png")

    procs.fill("2")
    procs.press("Enter")
    expect(launch).to_be_enabled()
    expect(panel.locator(".nbddp-error-procs")).to_have_text("")
    launch.click()

    expect(panel.locator('tr.nbddp-rank[data-state="done"]')).to_have_count(2, timeout=90 * MS)
    expect(panel.locator('.nbddp-run-state[data-state="done"]')).to_be_visible()
    expect(panel.locator(".nbddp-chart svg").first).to_be_visible()
    expect(panel.locator(".nbddp-chart")).to_contain_text("loss")
    expect(panel.locator(".nbddp-result")).to_contain_text("rank 0 returned 0")
    expect(panel.locator(".nbddp-rank-output").first).to_contain_text("step 29 on rank 0")

    # The same run as code, shown in the panel.
    panel.get_by_text("Same run as code").click()
    code = panel.locator(".nbddp-code-launch")
    expect(code).to_have_text("result = nbddp.launch(train, 30, 0.02, procs=2)")
    expect(panel.locator(".nbddp-code-magic")).to_contain_text("%%ddp --no-init --procs 2")
    shot(page, "panel-done.png")


def test_stop_ends_the_run_and_rerunning_the_cell_leaves_no_process(
    page: Page, lab_server: Lab
) -> None:
    open_and_run(page, lab_server, "panel_stop.ipynb", [TRAIN, "nbddp.panel(train, 10**6, 0.02)"])
    panel = page.locator(".nbddp-panel")
    expect(panel).to_have_count(1, timeout=60 * MS)
    panel.locator("button.nbddp-launch").click()
    expect(panel.locator('tr.nbddp-rank[data-state="running"]')).to_have_count(2, timeout=90 * MS)
    expect(panel.locator(".nbddp-chart svg").first).to_be_visible(timeout=30 * MS)
    ranks = ranks_running()
    assert len(ranks) == 2, ranks
    shot(page, "panel-running.png")

    panel.locator("button.nbddp-stop").click()
    expect(panel.locator('.nbddp-run-state[data-state="stopped"]')).to_be_visible(timeout=30 * MS)
    expect(panel.locator('tr.nbddp-rank[data-state="stopped"]')).to_have_count(2)
    assert not wait_procs_gone(ranks, timeout=10)
    expect(panel.locator("button.nbddp-launch")).to_be_enabled()
    shot(page, "panel-stopped.png")

    # Launch again from the same panel, then run its cell again: the new
    # panel replaces it and the old panel's run is stopped.
    panel.locator("button.nbddp-launch").click()
    expect(panel.locator('tr.nbddp-rank[data-state="running"]')).to_have_count(2, timeout=90 * MS)
    ranks = ranks_running()
    assert len(ranks) == 2, ranks
    run_cell(page, 1)
    expect(page.locator('.nbddp-panel .nbddp-run-state[data-state="idle"]')).to_be_visible(
        timeout=30 * MS
    )
    assert not wait_procs_gone(ranks, timeout=15)
    shot(page, "panel-rerun.png")


def test_ddp_cell_shows_rank_blocks_and_a_live_chart(page: Page, lab_server: Lab) -> None:
    # The %%ddp display as JupyterLab renders it: one block per
    # rank with its tqdm bar drawn in place, and the metrics chart.
    cell = """\
%%ddp --procs 2
from tqdm import tqdm
import threading, nbddp
for step in tqdm(range(40), desc=f"rank {rank}", ascii=True):
    nbddp.log(step=step, loss=1.0 / (step + 1), acc=step / 40)
    threading.Event().wait(0.01)
print("finished", rank)
"""
    open_and_run(page, lab_server, "ddp_cell.ipynb", ["%load_ext nbddp", cell])
    output = page.locator(".jp-Cell").nth(1).locator(".jp-OutputArea")
    expect(output).to_contain_text("finished 1", timeout=90 * MS)
    expect(output).to_contain_text("rank 0 · done")
    expect(output).to_contain_text("rank 1 · done")
    expect(output.locator(".nbddp-metrics svg")).to_have_count(2)  # loss and acc
    text = output.inner_text()
    for rank in (0, 1):
        bars = [line for line in text.splitlines() if line.startswith(f"rank {rank}: ")]
        assert len(bars) == 1 and "40/40" in bars[0], bars
    shot(page, "ddp-cell.png")


def test_every_invalid_field_is_flagged_at_once(page: Page, lab_server: Lab) -> None:
    open_and_run(page, lab_server, "panel_invalid.ipynb", [TRAIN, "nbddp.panel(train, 30, 0.02)"])
    panel = page.locator(".nbddp-panel")
    expect(panel).to_have_count(1, timeout=60 * MS)
    launch = panel.locator("button.nbddp-launch")
    with shot_on_failure(page, "panel-validation.png"):
        # Letters in a number field, a port that is none, a variable nbddp sets
        # itself (only the whole launch's check sees that), and a function
        # argument that is not a Python literal: all at once.
        retype(panel.locator(".nbddp-field-procs input"), "two")
        retype(panel.locator(".nbddp-field-port input"), "http")
        retype(panel.locator(".nbddp-field-env textarea"), "MASTER_PORT=29500")
        retype(panel.locator(".nbddp-field-kwargs input"), "epochs=fast")
        retype(panel.locator(".nbddp-field-timeout input"), "-5")  # quoted as typed
        expect(launch).to_have_text("Fix 5 fields to launch")
        expect(launch).to_be_disabled()
        said = {
            "procs": "a whole number, e.g. 2",
            "port": "a port number",
            "env": "nbddp sets MASTER_PORT itself",
            "kwargs": "entry 1 (epochs=fast)",
            "timeout": "must be positive (seconds), got -5;",
        }
        for name, text in said.items():
            expect(panel.locator(f".nbddp-error-{name}")).to_contain_text(text)
            expect(panel.locator(f".nbddp-field-{name}")).to_have_class(re.compile("nbddp-invalid"))
        # Each field is flagged where a person looks: its own box turns red.
        box = panel.locator(".nbddp-field-procs input")
        assert box.evaluate("e => getComputedStyle(e).borderTopColor") == "rgb(214, 39, 40)"
        # The device choice: its label beside both buttons, on one line.
        device = panel.locator(".nbddp-field-device")
        label, gpus = device.locator(".widget-label"), device.get_by_role("button", name="GPUs")
        assert abs(label.bounding_box()["y"] - gpus.bounding_box()["y"]) < 10
        expect(panel.locator(".nbddp-gpus-note")).to_have_text(
            "No GPU found on this machine: runs use CPU processes (gloo)."
        )
        shot(page, "panel-validation.png")

    retype(panel.locator(".nbddp-field-procs input"), "2")
    retype(panel.locator(".nbddp-field-port input"), "")
    retype(panel.locator(".nbddp-field-env textarea"), "")
    retype(panel.locator(".nbddp-field-kwargs input"), "")
    retype(panel.locator(".nbddp-field-timeout input"), "")
    expect(launch).to_have_text("Launch")
    expect(launch).to_be_enabled()
    expect(panel.locator(".nbddp-invalid")).to_have_count(0)

    # GPUs on a machine without one: a live choice that says why it cannot be.
    device = panel.locator(".nbddp-field-device")
    with shot_on_failure(page, "panel-no-gpu.png"):
        device.get_by_role("button", name="GPUs").click()
        expect(panel.locator(".nbddp-error-device")).to_have_text(
            "no GPU is visible to this notebook; choose CPU processes"
        )
        expect(launch).to_have_text("Fix 1 field to launch")
        shot(page, "panel-no-gpu.png")
    device.get_by_role("button", name="CPU processes").click()
    expect(launch).to_have_text("Launch")


CODE_NOTEBOOK = [
    """\
import os
import nbddp


class Weights:
    def __init__(self, values):
        self.values = list(values)

    def __repr__(self):
        return f"<Weights of {len(self.values)}>"


def train(steps, weights, *, lr=0.1, tag="plain"):
    world = os.environ["WORLD_SIZE"]
    return f"{tag}: steps={steps} weights={sum(weights.values)} lr={lr} world={world}"


w = Weights([1, 2, 3])
""",
    "p = nbddp.panel(train, 3, w)",
]


def test_same_run_as_code_runs_as_pasted_in_a_new_cell(page: Page, lab_server: Lab) -> None:
    open_and_run(page, lab_server, "panel_code.ipynb", CODE_NOTEBOOK)
    panel = page.locator(".nbddp-panel")
    expect(panel).to_have_count(1, timeout=60 * MS)
    panel.get_by_text("Same run as code").click()
    code = panel.locator(".nbddp-code-launch")
    with shot_on_failure(page, "panel-code.png"):
        # The notebook's own names and literals, never args[i].
        expect(code).to_have_text("result = nbddp.launch(train, 3, w, procs=2)")
        retype(panel.locator(".nbddp-field-procs input"), "3")
        retype(panel.locator(".nbddp-field-timeout input"), "120")
        retype(panel.locator(".nbddp-field-kwargs input"), "lr=0.5, tag='pasted'")
        expect(code).to_have_text(
            "result = nbddp.launch(train, 3, w, lr=0.5, tag='pasted', procs=3, timeout=120)"
        )
        panel.locator("button.nbddp-launch").click()
        expect(panel.locator('.nbddp-run-state[data-state="done"]')).to_be_visible(timeout=90 * MS)
        value = "'pasted: steps=3 weights=6 lr=0.5 world=3'"
        expect(panel.locator(".nbddp-result")).to_contain_text(f"rank 0 returned {value}")
        expect(panel.locator(".nbddp-result")).to_contain_text("full value: p.value")
        shot(page, "panel-code.png")

    # Copy the code as a person would (one click selects it all) into a new cell.
    code.click()
    page.keyboard.press("Control+c")
    page.evaluate(
        """() => {
            const notebook = window.jupyterapp.shell.currentWidget.content;
            notebook.activeCellIndex = notebook.widgets.length - 1;
            return window.jupyterapp.commands.execute('notebook:insert-cell-below');
        }"""
    )
    new_cell = page.locator(".jp-Notebook .jp-Cell").nth(2)
    new_cell.locator(".cm-content").click()
    page.keyboard.press("Control+v")
    expect(new_cell.locator(".cm-content")).to_have_text(code.inner_text())
    run_cell(page, 2)
    out = new_cell.locator(".jp-OutputArea")
    with shot_on_failure(page, "panel-code-pasted.png"):
        expect(out).to_contain_text("rank 2 · done", timeout=90 * MS)  # three ranks too
        page.wait_for_function(KERNEL_IDLE, timeout=60 * MS)
        # The value is bound to a name, not printed as the cell's output.
        expect(new_cell.locator(".jp-OutputArea-executeResult")).to_have_count(0)
        # The same function, arguments and value: the kernel compares them itself.
        page.evaluate(
            """() => {
                const notebook = window.jupyterapp.shell.currentWidget.content;
                notebook.activeCellIndex = 2;
                return window.jupyterapp.commands.execute('notebook:insert-cell-below');
            }"""
        )
        check = page.locator(".jp-Notebook .jp-Cell").nth(3)
        check.locator(".cm-content").click()
        page.keyboard.type("print('same value:', result == p.value)")
        run_cell(page, 3)
        expect(check.locator(".jp-OutputArea")).to_contain_text("same value: True", timeout=30 * MS)
        check.locator(".jp-OutputArea").scroll_into_view_if_needed()
        shot(page, "panel-code-pasted.png")
