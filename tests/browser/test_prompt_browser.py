"""A rank at a prompt beside ranks that go on, in a real JupyterLab (headless Chromium).

While rank 1 waits at ``input()``, rank 0's block keeps streaming; once answered the
run finishes. A prompt whose rank ended (another rank failed) is withdrawn: the cell
ends with the failure and says the box takes no answer. The test waits on the page's
content, never on time; screenshots land in ``artifacts_dir()``.
"""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect

from tests.browser.lab import KERNEL_IDLE, MS, Lab, write_notebook
from tests.browser.test_panel_browser import ranks_running, shot
from tests.procs import wait_procs_gone

pytestmark = pytest.mark.timeout(300)

BESIDE = """\
%%ddp --procs 2
import os, time
if rank == 1:
    print("rank 1 got", input("go? "))
    open("answered", "w").close()
else:
    i = 0
    while not os.path.exists("answered"):
        print("tick", i, flush=True)
        i += 1
        time.sleep(0.05)
"""

WITHDRAWN = """\
%%ddp --procs 2
import os, time
if rank == 0:
    input("name? ")
else:
    while not os.path.exists("asked"):
        time.sleep(0.01)
    raise ValueError("rank 1 failed while rank 0 was asked")
"""


def test_a_prompt_beside_a_printing_rank_and_one_withdrawn(page: Page, lab_server: Lab) -> None:
    for name in ("answered", "asked"):
        (lab_server.root / name).unlink(missing_ok=True)
    write_notebook(lab_server.root / "prompt_beside.ipynb", ["%load_ext nbddp", BESIDE])
    page.goto(lab_server.notebook_url("prompt_beside.ipynb"))
    page.wait_for_function(KERNEL_IDLE, timeout=90 * MS)
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
    output = page.locator(".jp-Cell").nth(1).locator(".jp-OutputArea")
    stdin = output.locator(".jp-Stdin-input")
    expect(output.locator(".jp-Stdin-prompt")).to_contain_text("go? [rank 1]", timeout=90 * MS)
    expect(output).to_contain_text("rank 1 · waiting for input")
    # Rank 0 goes on, its last lines shown live (unfolded) while the prompt waits in view.
    live = output.locator('details[data-rank="0"] pre')
    expect(live).to_have_text(re.compile(r"tick ([6-9]\d|\d{3,})\s*$"), timeout=60 * MS)
    expect(live).to_be_visible()
    expect(output.locator(".jp-Stdin-input")).to_be_in_viewport()
    shot(page, "prompt-beside-output.png")
    stdin.fill("yes")
    stdin.press("Enter")
    expect(output).to_contain_text("rank 1 got yes", timeout=60 * MS)
    expect(output).to_contain_text("rank 1 · done", timeout=60 * MS)
    page.wait_for_function(KERNEL_IDLE, timeout=60 * MS)
    shot(page, "prompt-beside-done.png")

    write_notebook(lab_server.root / "prompt_withdrawn.ipynb", ["%load_ext nbddp", WITHDRAWN])
    page.goto(lab_server.notebook_url("prompt_withdrawn.ipynb"))
    page.wait_for_function(KERNEL_IDLE, timeout=90 * MS)
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
    output = page.locator(".jp-Cell").nth(1).locator(".jp-OutputArea")
    expect(output.locator(".jp-Stdin-prompt")).to_contain_text("name? [rank 0]", timeout=90 * MS)
    (lab_server.root / "asked").touch()  # rank 1 fails while the box waits for the user
    expect(output).to_contain_text("rank 1 failed while rank 0 was asked", timeout=60 * MS)
    expect(output).to_contain_text(
        "[rank 0] no longer asks: it ended, so its prompt takes no answer"
    )
    page.wait_for_function(KERNEL_IDLE, timeout=60 * MS)
    shot(page, "prompt-withdrawn.png")
    assert wait_procs_gone(ranks_running(), timeout=10.0) == []
