"""The panel in a real JupyterLab, clicked in headless Chromium (Playwright).

Each test writes a notebook into the lab's root, opens it, runs every cell
through JupyterLab's own command, and then works the panel as a person
would: typing into fields, clicking Launch and Stop, re-running a cell.
It waits on the ``data-state`` attributes the panel renders, never on time.
Screenshots land in ``artifacts_dir()`` (printed at the end of the run).
"""

from __future__ import annotations

from typing import Any

import psutil
import pytest
from playwright.sync_api import Page, expect

from tests.browser.lab import Lab, artifacts_dir, write_notebook
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
KERNEL_IDLE = """() => {
    const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
    const kernel = w && w.sessionContext && w.sessionContext.session
        && w.sessionContext.session.kernel;
    return !!kernel && kernel.connectionStatus === 'connected' && kernel.status === 'idle';
}"""
MS = 1000


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


def ranks_running() -> list[psutil.Process]:
    return [p for p in ours() if p.name().startswith("nbddp-rank")]


@pytest.fixture
def page(chromium: Any) -> Any:
    context = chromium.new_context(viewport={"width": 1280, "height": 1500})
    page = context.new_page()
    yield page
    context.close()


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
    expect(code).to_have_text("nbddp.launch(train, 30, 0.02, procs=2)")
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
    # The %%ddp display (issue 4) as JupyterLab renders it: one block per
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
