"""A failing run's error as JupyterLab shows it, in headless Chromium (Playwright).

One notebook, its cells run one at a time as Shift+Enter runs them: a function
defined in a cell and launched with ``nbddp.launch`` fails on rank 1; a
``%%ddp`` cell fails on rank 1 while rank 0 waits in a collective; a launch is
interrupted with the kernel's interrupt. Each error must read like the
notebook's own: the cell named as its prompt names it, the failing line, none
of nbddp's frames, one plain line for the rank that failed because another
did, and one line for the interrupt. Screenshots of the three cells land in
``artifacts_dir()``; they are taken before the checks, so that they show what
a person saw even when a check fails.
"""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Locator, Page, expect

from tests.browser.lab import KERNEL_IDLE, MS, Lab, artifacts_dir, write_notebook
from tests.sources import FAILING_TRAIN

pytestmark = pytest.mark.timeout(300)

TRAIN = FAILING_TRAIN
DDP_CELL = """\
%%ddp --procs 2
import torch
import torch.distributed as dist
t = torch.ones(1)
if rank == 1:
    raise ValueError("boom on rank 1")
for _ in range(10_000):
    dist.all_reduce(t)
"""
HANG = """\
import threading
def hang():
    print("waiting", flush=True)
    threading.Event().wait()
nbddp.launch(hang, procs=2)
"""
CELLS = ["%load_ext nbddp\nimport nbddp", TRAIN, "nbddp.launch(train, 10_000, procs=2)", DDP_CELL]
NBDDP_FRAMES = re.compile(r"nbddp/(rank|launcher|notebook|wire)|entry\.py|run\.py|_pump")
RED = "rgb(214, 39, 40)"  # ``display.blocks``' failed


@pytest.fixture
def viewport() -> dict[str, int]:
    return {"width": 1100, "height": 1400}


def run(page: Page, index: int) -> Locator:
    """Run cell ``index`` as Shift+Enter on it would; the cell."""
    page.evaluate(
        """(index) => {
            const notebook = window.jupyterapp.shell.currentWidget.content;
            notebook.activeCellIndex = index;
            // Not awaited: the promise settles only when the cell ends.
            window.jupyterapp.commands.execute('notebook:run-cell');
        }""",
        index,
    )
    return page.locator(".jp-Notebook .jp-Cell").nth(index)


def finished(cell: Locator) -> int:
    """Wait for ``cell`` to finish; its execution count, as its prompt shows it."""
    prompt = cell.locator(".jp-InputPrompt")
    expect(prompt).to_have_text(re.compile(r"^\s*\[\d+\]:\s*$"), timeout=120 * MS)
    return int(re.sub(r"\D", "", prompt.inner_text()))


def error_text(cell: Locator) -> str:
    """The cell's error output as the page shows it (its traceback's lines)."""
    error = cell.locator('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')
    expect(error.last).to_be_visible(timeout=120 * MS)
    return error.last.inner_text()


def header(cell: Locator, rank: int) -> tuple[str, str]:
    """The header of ``rank``'s block in the cell's output: its text and its colour."""
    block = cell.locator(f'.nbddp-rank[data-rank="{rank}"]')
    expect(block).to_have_count(1)
    head = block.locator("summary, div").first  # a folded block's summary, else its line
    color = head.evaluate("(el) => getComputedStyle(el).color")
    return head.inner_text(), str(color)


def shot(cell: Locator, name: str) -> None:
    path = artifacts_dir() / name
    cell.scroll_into_view_if_needed()
    cell.screenshot(path=str(path))
    print(f"screenshot: {path}")


def test_failures_and_an_interrupt_read_like_the_notebooks_own_code(
    page: Page, lab_server: Lab
) -> None:
    write_notebook(lab_server.root / "errors.ipynb", [*CELLS, HANG])
    page.goto(lab_server.notebook_url("errors.ipynb"))
    page.wait_for_function(KERNEL_IDLE, timeout=90 * MS)
    finished(run(page, 0))
    defined_in = finished(run(page, 1))

    launched = run(page, 2)
    finished(launched)
    launch_error = error_text(launched)
    shot(launched, "errors-launch.png")

    ddp = run(page, 3)
    ddp_number = finished(ddp)
    ddp_error = error_text(ddp)
    shot(ddp, "errors-ddp-cell.png")

    hanging = run(page, 4)
    expect(hanging.locator(".jp-OutputArea")).to_contain_text("waiting", timeout=120 * MS)
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:interrupt-kernel'); }")
    finished(hanging)
    interrupt_error = error_text(hanging)
    shot(hanging, "errors-interrupt.png")

    # The headers: rank 1 raised (red), rank 0 stopped because of it (not red).
    for cell in (launched, ddp):
        raised, stopped = header(cell, 1), header(cell, 0)
        assert raised[0].startswith("rank 1 · failed") and raised[1] == RED, raised
        assert stopped[0].startswith("rank 0 · stopped") and stopped[1] != RED, stopped
    for rank in (0, 1):
        assert header(hanging, rank)[0].startswith(f"rank {rank} · interrupted")
    # launch(): the function's own cell and line, nothing of nbddp's, the other rank.
    assert f"Cell In[{defined_in}], line 7, in train" in launch_error, launch_error
    assert 'raise ValueError("bad batch on rank 1")' in launch_error
    assert not NBDDP_FRAMES.search(launch_error), launch_error
    assert re.search(r"^rank 0: stopped (in a collective )?after rank 1 failed", launch_error, re.M)
    # %%ddp: the cell's own number (its prompt's), its line, the other rank in one plain line.
    assert f"Cell In[{ddp_number}], line 6, in <module>" in ddp_error, ddp_error
    assert 'raise ValueError("boom on rank 1")' in ddp_error
    assert not NBDDP_FRAMES.search(ddp_error), ddp_error
    assert re.search(r"^rank 0: stopped (in a collective )?after rank 1 failed", ddp_error, re.M)
    assert "pair.cc" not in ddp_error and "GLHF" not in ddp_error and ddp_error.isascii()
    # JupyterLab makes a path in an error a link that asks to start its debugger (the log is
    # outside its root): the error names the log, and rank 1's block shows its path as text.
    assert re.search(
        r"^full output in rank1\.log, its path under rank 1's block above$", ddp_error, re.M
    )
    assert "/rank1.log" not in ddp_error
    note = ddp.locator('.nbddp-rank[data-rank="1"] .nbddp-note')
    expect(note).to_have_text(re.compile(r"^full output in /\S+/rank1\.log$"))
    expect(note.locator("a")).to_have_count(0)  # selectable text, no link
    expect(ddp.locator(".jp-RenderedText a", has_text="rank1.log")).to_have_count(0)
    note.click(click_count=3)  # selects the line, as a person copying it would
    assert re.fullmatch(
        r"full output in /\S+/rank1\.log\s*", page.evaluate("getSelection().toString()")
    )
    expect(page.locator(".jp-Dialog")).to_have_count(0)
    shot(ddp, "errors-log-path.png")
    # The interrupt: one line.
    assert re.fullmatch(
        r"KeyboardInterrupt: every rank was stopped; their output is in /\S+\s*", interrupt_error
    ), interrupt_error
