"""A rank's debugger prompt in a real JupyterLab (headless Chromium, Playwright).

A ``%%ddp`` cell stops rank 1 at ``breakpoint()``: JupyterLab's input box
appears in the cell naming the rank, the user types pdb commands into it,
the answers show in rank 1's block, and ``c`` lets the run finish. The test
waits on the page's content, never on time; screenshots land in
``artifacts_dir()``.
"""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from tests.browser.lab import KERNEL_IDLE, MS, Lab, write_notebook
from tests.browser.test_panel_browser import ranks_running, shot
from tests.procs import wait_procs_gone

pytestmark = pytest.mark.timeout(300)

CELL = """\
%%ddp --procs 2
x = 6 * (rank + 1)
if rank == 1:
    breakpoint()
print("done", x)
"""


def test_a_breakpoint_prompts_in_the_cell_and_the_run_completes(
    page: Page, lab_server: Lab
) -> None:
    write_notebook(lab_server.root / "debug_cell.ipynb", ["%load_ext nbddp", CELL])
    page.goto(lab_server.notebook_url("debug_cell.ipynb"))
    page.wait_for_function(KERNEL_IDLE, timeout=90 * MS)
    # Not awaited: running the cells resolves only once the prompt is answered.
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
    output = page.locator(".jp-Cell").nth(1).locator(".jp-OutputArea")
    stdin = output.locator(".jp-Stdin-input")
    expect(output.locator(".jp-Stdin-prompt")).to_contain_text("(Pdb) [rank 1]", timeout=90 * MS)
    expect(output).to_contain_text("rank 1 · waiting for input")
    shot(page, "debug-prompt.png")
    box = stdin.element_handle()
    box.fill("p x * 7")
    box.press("Enter")
    expect(output).to_contain_text("84", timeout=30 * MS)  # pdb's answer, from rank 1
    # JupyterLab replaces an answered box with the echoed line, and the next
    # prompt brings a new box: the answer goes to the new one once the old is gone.
    box.wait_for_element_state("hidden", timeout=30 * MS)
    expect(stdin).to_have_count(1, timeout=30 * MS)
    shot(page, "debug-answered.png")
    box = stdin.element_handle()
    box.fill("ll")  # the whole cell: a transcript longer than a finished tail shows
    box.press("Enter")
    expect(output).to_contain_text('print("done", x)', timeout=30 * MS)
    box.wait_for_element_state("hidden", timeout=30 * MS)
    expect(stdin).to_have_count(1, timeout=30 * MS)
    stdin.fill("c")
    stdin.press("Enter")
    expect(output).to_contain_text("done 12", timeout=60 * MS)
    expect(output).to_contain_text("rank 1 · done")
    page.wait_for_function(KERNEL_IDLE, timeout=60 * MS)
    shot(page, "debug-done.png")
    # After "c" the transcript stays in view, as the user left it.
    transcript = output.locator('details[data-rank="1"]')
    expect(transcript).to_have_attribute("open", "")
    expect(transcript.locator("pre")).to_be_visible()
    expect(transcript.locator("pre")).to_contain_text("84")
    expect(transcript.locator("pre")).to_contain_text("done 12")
    assert wait_procs_gone(ranks_running(), timeout=10.0) == []
