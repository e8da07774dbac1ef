"""What a cell shows of a run, in a real JupyterLab, in headless Chromium (Playwright).

An interrupted ``%%ddp`` cell, and an interrupted ``nbddp.launch()`` cell,
must end with every rank's header saying it was interrupted (never a
"running" left behind). A ``launch(block=False)`` run must draw its blocks
in its own cell and keep them updated while two later cells run and print,
each cell's prints staying in that cell. The tests wait on the page's
content and the kernel's state, never on time; each takes its screenshot
before its checks, so a failing run still leaves a picture of what it drew.
"""

from __future__ import annotations

import contextlib
import re

import pytest
from playwright.sync_api import Locator, Page, expect

from tests.browser.lab import KERNEL_IDLE, MS, Lab, shot, write_notebook

pytestmark = pytest.mark.timeout(300)

SPIN = """\
import os, threading
import nbddp
%load_ext nbddp


def spin():
    rank = int(os.environ["RANK"])
    for step in range(10**6):
        print(f"rank {rank} step {step}", flush=True)
        threading.Event().wait(0.05)
"""
INTERRUPTED_CELLS = [SPIN, "%%ddp --procs 2\nspin()", "nbddp.launch(spin, procs=2)"]
BACKGROUND_CELLS = [
    SPIN,
    "run = nbddp.launch(spin, procs=2, block=False)",
    # Each of these cells prints, then waits until rank 0 has printed 20 more lines.
    """\
seen = run.output(0).count("\\n")
for i in range(3):
    print("cell A says", i, flush=True)
    while run.output(0).count("\\n") < seen + 20 * (i + 1):
        threading.Event().wait(0.05)
""",
    """\
seen = run.output(0).count("\\n")
for i in range(3):
    print("cell B says", i, flush=True)
    while run.output(0).count("\\n") < seen + 20 * (i + 1):
        threading.Event().wait(0.05)
""",
]
# Whether a cell is queued or running: JupyterLab's prompt reads "[*]:".
BUSY = "(cell) => cell.querySelector('.jp-InputPrompt').textContent.includes('*')"


@pytest.fixture
def viewport() -> dict[str, int]:
    return {"width": 1100, "height": 2000}


def output(page: Page, index: int) -> Locator:
    return page.locator(".jp-Cell").nth(index).locator(".jp-OutputArea")


# The commands are started, not awaited: a cell's promise settles only when it ends.
def start_all(page: Page, lab: Lab, name: str, sources: list[str]) -> None:
    """Write the notebook, open it, wait for its kernel, start running every cell."""
    write_notebook(lab.root / name, sources)
    page.goto(lab.notebook_url(name))
    page.wait_for_function(KERNEL_IDLE, timeout=90 * MS)
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")


def add_and_start(page: Page, index: int, code: str) -> None:
    """Insert a cell of ``code`` at ``index`` and start running it."""
    page.evaluate(
        """([index, code]) => {
            const notebook = window.jupyterapp.shell.currentWidget.content;
            notebook.model.sharedModel.insertCell(index, {cell_type: 'code', source: code});
            notebook.activeCellIndex = index;
            window.jupyterapp.commands.execute('notebook:run-cell');
        }""",
        [index, code],
    )


def interrupt(page: Page) -> None:
    page.evaluate("() => { window.jupyterapp.commands.execute('kernelmenu:interrupt'); }")


def test_an_interrupted_cell_ends_with_every_rank_interrupted(page: Page, lab_server: Lab) -> None:
    start_all(page, lab_server, "cell_interrupted.ipynb", INTERRUPTED_CELLS[:2])
    for index in (1, 2):
        if index == 2:
            add_and_start(page, 2, INTERRUPTED_CELLS[2])
        cell = output(page, index)
        expect(cell).to_contain_text("rank 1 · running", timeout=90 * MS)
        expect(cell).to_contain_text("step 3")
        interrupt(page)
        expect(cell).to_contain_text("KeyboardInterrupt", timeout=60 * MS)
        page.wait_for_function(KERNEL_IDLE, timeout=60 * MS)
    page.locator(".jp-Cell").nth(1).scroll_into_view_if_needed()
    shot(page, "cell-interrupted.png")
    for index in (1, 2):
        cell = output(page, index)
        headers = cell.locator(".nbddp-rank")
        expect(headers).to_have_count(2)
        expect(cell.locator('.nbddp-rank[data-state="interrupted"]')).to_have_count(2)
        expect(cell).not_to_contain_text("· running ·")
        for rank in (0, 1):
            expect(cell).to_contain_text(f"rank {rank} · interrupted · ")


def test_a_background_run_updates_its_own_cell_while_two_others_run(
    page: Page, lab_server: Lab
) -> None:
    start_all(page, lab_server, "cell_background.ipynb", BACKGROUND_CELLS)
    blocks, cell_a, cell_b = output(page, 1), output(page, 2), output(page, 3)
    # While cell B runs (cell A has finished), the run's cell changes under it.
    expect(cell_b).to_contain_text("cell B says 0", timeout=120 * MS)
    b_cell = page.locator(".jp-Cell").nth(3)
    before = blocks.text_content()
    expect(cell_b).to_contain_text("cell B says 1", timeout=60 * MS)
    page.wait_for_function(
        "([cell, old]) => cell.textContent !== old",
        arg=[blocks.element_handle(), before],
        timeout=60 * MS,
    )
    # The live tail shows unfolded; one folded by a click stays folded through updates.
    live = blocks.locator('details[data-rank="1"]')
    expect(live).to_have_attribute("open", "")
    expect(live.locator("pre")).to_be_visible()
    expect(live.locator("pre")).to_contain_text(re.compile(r"rank 1 step \d+$"))
    for _ in range(3):  # a click can land on a header being redrawn: click until it folds
        blocks.locator('details[data-rank="0"] summary').click()
        with contextlib.suppress(AssertionError):
            expect(blocks.locator('details[data-rank="0"] pre')).to_be_hidden(timeout=5 * MS)
            break
    folded = blocks.text_content()
    page.wait_for_function(
        "([cell, old]) => cell.textContent !== old",
        arg=[blocks.element_handle(), folded],
        timeout=60 * MS,
    )
    busy = b_cell.evaluate(BUSY)
    shot(page, "cell-background-live.png")
    expect(blocks.locator('details[data-rank="0"]')).not_to_have_attribute("open", "")
    expect(live).to_have_attribute("open", "")
    expect(live.locator(".nbddp-note")).to_contain_text("lines; all in")
    assert busy, "cell B had finished: the update was not seen while it ran"
    assert before and "rank 0 · running" in before, before
    expect(blocks.locator(".nbddp-rank")).to_have_count(2)
    expect(cell_a).to_have_text("cell A says 0\ncell A says 1\ncell A says 2", use_inner_text=True)
    for other in (cell_a, cell_b):
        expect(other).not_to_contain_text("step")  # the ranks' output stays in its cell
    expect(blocks).not_to_contain_text("says")  # and the cells' prints in theirs
    page.wait_for_function(KERNEL_IDLE, timeout=60 * MS)

    # Stop it from a new cell: the run's own cell ends with both ranks stopped.
    add_and_start(
        page, 4, "run.stop()\ntry:\n    run.wait()\nexcept nbddp.RankError:\n    print('stopped')"
    )
    expect(output(page, 4)).to_contain_text("stopped", timeout=60 * MS)
    expect(blocks.locator('.nbddp-rank[data-state="stopped"]')).to_have_count(2)
    expect(output(page, 4).locator(".nbddp-rank")).to_have_count(0)  # no second copy
    shot(page, "cell-background-stopped.png")


ENDINGS = """\
import signal


def fail_one():
    rank = int(os.environ["RANK"])
    print(f"rank {rank} up", flush=True)
    if rank == 1:
        threading.Event().wait(0.5)
        raise ValueError("rank 1 fails on purpose")
    spin()


def killed():
    if os.environ["RANK"] == "1":
        os.kill(os.getpid(), signal.SIGKILL)
    spin()


def show(**options):
    try:
        nbddp.launch(**options)
    except Exception as exc:
        print("raised", type(exc).__name__)
"""
ENDING_CELLS = [
    SPIN + ENDINGS,
    "show(fn=fail_one, procs=2)",
    "show(fn=killed, procs=2)",
    "show(fn=spin, procs=2, timeout=2)",
]


def test_how_each_rank_ended_is_told_apart(page: Page, lab_server: Lab) -> None:
    start_all(page, lab_server, "cell_endings.ipynb", ENDING_CELLS)
    expect(output(page, 3)).to_contain_text("raised", timeout=120 * MS)
    page.wait_for_function(KERNEL_IDLE, timeout=60 * MS)
    shot(page, "cell-endings.png")
    expected = {
        1: {0: ("cancelled", "stopped: rank 1 failed"), 1: ("failed", "failed: ValueError")},
        2: {0: ("cancelled", "stopped: rank 1 failed"), 1: ("exited", "killed by SIGKILL")},
        3: {0: ("timed out", "timed out"), 1: ("timed out", "timed out")},
    }
    colours = {}
    for index, ranks in expected.items():
        cell = output(page, index)
        for rank, (state, words) in ranks.items():
            block = cell.locator(f'.nbddp-rank[data-rank="{rank}"]')
            expect(block).to_have_attribute("data-state", state)
            expect(block).to_contain_text(f"rank {rank} · {words} · ")
            header = block.locator("summary, div").first
            colours[state] = header.evaluate("e => getComputedStyle(e).color")
    # The rank that failed, the ranks it stopped and the timeout each read apart.
    assert len({colours["failed"], colours["cancelled"], colours["timed out"]}) == 3, colours


CHATTY = """\
import os
import nbddp


def chatty(steps, lines):
    for i in range(steps):
        for j in range(lines):
            print(f"step {i} line {j} on rank {os.environ['RANK']}", flush=True)
        nbddp.log(step=i, loss=1.0 / (i + 1))
    return int(os.environ["RANK"])
"""


def test_a_chatty_run_reads_as_folded_headers_with_the_tail_length(
    page: Page, lab_server: Lab
) -> None:
    cells = [CHATTY, "nbddp.launch(chatty, 100, 30, procs=2)"]
    start_all(page, lab_server, "cell_chatty.ipynb", cells)
    cell = output(page, 1)
    expect(cell).to_contain_text("rank 1 · done", timeout=120 * MS)
    page.wait_for_function(KERNEL_IDLE, timeout=60 * MS)
    shot(page, "cell-chatty.png")
    folds = cell.locator("details.nbddp-rank")
    expect(folds).to_have_count(2)
    for rank in (0, 1):
        fold = cell.locator(f'details[data-rank="{rank}"]')
        expect(fold).not_to_have_attribute("open", "")
        expect(fold.locator("summary")).to_have_text(
            re.compile(rf"^rank {rank} · done · \d+s · step 99 loss=0\.01 \(3,000 lines\)$")
        )
        expect(fold.locator(".nbddp-note")).to_contain_text("last 40 of 3,000 lines; all in")
        expect(fold.locator("pre")).to_be_hidden()  # folded: the tail is one click away


ORANGE = "rgb(230, 85, 13)"  # ``display.blocks``' interrupted


def test_a_run_shown_as_a_result_ends_true_and_an_interrupted_session_cell_reads_interrupted(
    page: Page, lab_server: Lab
) -> None:
    shown = "run = nbddp.launch(spin, procs=2, block=False)\nrun"
    start_all(page, lab_server, "cell_shown.ipynb", [SPIN, shown])
    line = output(page, 1).locator(".nbddp-run")
    expect(line).to_contain_text("running, 2 ranks (2 running)", timeout=90 * MS)
    add_and_start(page, 2, "run.stop()")
    expect(line).to_contain_text(": stopped, 2 ranks (2 stopped)", timeout=60 * MS)
    page.wait_for_function(KERNEL_IDLE, timeout=60 * MS)

    add_and_start(page, 3, "%ddp_session start --procs 2")
    expect(output(page, 3)).to_contain_text("0 cells run", timeout=90 * MS)
    page.wait_for_function(KERNEL_IDLE, timeout=60 * MS)
    add_and_start(page, 4, "%%ddp\nspin()")
    cell = output(page, 4)
    expect(cell).to_contain_text("rank 1 step 3", timeout=90 * MS)
    interrupt(page)
    expect(cell).to_contain_text("KeyboardInterrupt", timeout=60 * MS)
    page.wait_for_function(KERNEL_IDLE, timeout=60 * MS)
    page.locator(".jp-Cell").nth(1).scroll_into_view_if_needed()
    shot(page, "cell-shown-and-session-interrupted.png")
    for rank in (0, 1):
        head = cell.locator(f'.nbddp-rank[data-rank="{rank}"] summary')
        expect(head).to_contain_text(f"rank {rank} · interrupted · ")
        expect(head).to_have_css("color", ORANGE)
    add_and_start(page, 5, "%ddp_session stop")
    page.wait_for_function(KERNEL_IDLE, timeout=60 * MS)
