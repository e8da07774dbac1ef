"""A ``%%ddp --cluster slurm`` cell and a session across the allocation's two nodes, in a
real JupyterLab started inside the allocation, as a user sees them (headless Chromium;
the screenshots are saved to look at)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.browser.lab import KERNEL_IDLE, MS, browser, lab, shot, write_notebook

pytestmark = pytest.mark.timeout(300)

CELLS = [
    "%load_ext nbddp",
    "%%ddp --nodes 2 --procs 2 --cluster slurm\n"
    "import os, torch, torch.distributed as dist\n"
    "t = torch.ones(1) * rank\ndist.all_reduce(t)\n"
    "node = os.environ['SLURMD_NODENAME']\n"
    "print(f'rank {rank} of {world_size} on {node}: sum {t.item():g}')\n",
    "%ddp_session start --nodes 2 --procs 1 --cluster slurm",
    "%%ddp\nimport os\nnode = os.environ['SLURMD_NODENAME']\nif rank == 1:\n"
    "    raise LookupError(f'no data on {node}')\n",
    "%%ddp\nprint('state kept on', node)\n",
    "import nbddp\nprint(nbddp.cluster.describe())\n%ddp_session stop",
]


@pytest.fixture
def page(in_allocation: str) -> Iterator[Any]:
    with lab() as server, browser() as chromium:
        page = chromium.new_page(viewport={"width": 1100, "height": 1900})
        write_notebook(server.root / "slurm.ipynb", CELLS)
        page.goto(server.notebook_url("slurm.ipynb"))
        page.wait_for_function(KERNEL_IDLE, timeout=90 * MS)
        yield page
        page.close()


def test_a_slurm_cell_and_a_session_as_the_user_sees_them(page: Any) -> None:
    # Running all cells stops at the one that raises (cell 3); then the cells below it run.
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
    failed = page.locator(".jp-Cell").nth(3).locator(".jp-OutputArea")
    expect(failed).to_contain_text("LookupError", timeout=180 * MS)
    page.wait_for_function(KERNEL_IDLE, timeout=60 * MS)
    page.evaluate(
        """() => {
            window.jupyterapp.shell.currentWidget.content.activeCellIndex = 4;
            window.jupyterapp.commands.execute('notebook:run-all-below');
        }"""
    )
    last = page.locator(".jp-Cell").nth(len(CELLS) - 1).locator(".jp-OutputArea")
    expect(last).to_contain_text("Slurm job", timeout=120 * MS)
    page.wait_for_function(KERNEL_IDLE, timeout=60 * MS)
    shot(page, "slurm-cells.png")
    cells = page.locator(".jp-Cell")
    ran = cells.nth(1).locator(".jp-OutputArea")
    for rank, node in ((0, "n1"), (1, "n1"), (2, "n2"), (3, "n2")):
        expect(ran).to_contain_text(f"rank {rank} of 4 on {node}: sum 6")
    failed = cells.nth(3).locator(".jp-OutputArea")
    expect(failed).to_contain_text("LookupError: no data on n2")
    expect(failed).to_contain_text("raised on rank 1 of 2")
    expect(cells.nth(4).locator(".jp-OutputArea")).to_contain_text("state kept on n1")
    expect(cells.nth(4).locator(".jp-OutputArea")).to_contain_text("state kept on n2")
