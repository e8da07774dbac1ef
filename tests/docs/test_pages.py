"""Every ``python`` block of the README and the docs pages runs as written.

Why Sybil: its parsers find a Markdown page's fenced blocks (with their line
numbers) and take an evaluator of our own per block type, so a block holding
IPython magics (``%%ddp``, ``%ddp_config``) runs in a real kernel, where the
reader runs it; pytest-markdown-docs only runs plain Python in the test
process, where a magic is a syntax error.

One real kernel per page (``tests/kernel/kernel.py``), its blocks in page
order, so a later block sees what an earlier one defined; Sybil parses the
page and hands each block to ``PageRun.evaluate``. A block whose first line is
``# sketch: ...`` is not run (the page says so where the reader sees it).
Where a page says its names come from elsewhere (``train``, ``X``...),
``SETUP`` defines them in the page's kernel first: small, and here to read.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import pytest
from sybil import Document, Example
from sybil.parsers.markdown import CodeBlockParser

from tests.docs.pages import PAGES, ROOT, SKETCH
from tests.kernel.kernel import Kernel

T = TypeVar("T")

# What the pages take as already defined in the notebook.
TRAIN = """
import nbddp
import torch
X, y = torch.randn(64, 8), torch.randint(0, 2, (64,))
def train(X, y):
    return (X.sum() + y.sum()).item()
"""
SETUP: dict[str, list[str]] = {
    "docs/index.md": [TRAIN + "def Net():\n    return torch.nn.Linear(8, 2)\n"],
    "docs/running.md": [
        TRAIN + "X, y = torch.randn(64, 64), torch.randint(0, 10, (64,))",
    ],
    "docs/panel.md": [TRAIN],
    "docs/sessions.md": [
        "%load_ext nbddp",
        TRAIN
        + """
from torch.nn.parallel import DistributedDataParallel as DDP
def Net():
    return torch.nn.Linear(8, 2)
lr = 0.1
def train_step(model, opt):
    loss = model(torch.randn(4, 8)).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
def fn(a, b):
    return a + b
args = (1, 2)
source, names = "value = scale * rank\\nvalue", {"scale": 10}
""",
    ],
    "docs/debugging.md": ["%load_ext nbddp"],
}
# Blocks that fail on purpose, by page and a line of the block: the error the page describes.
RAISES: dict[tuple[str, str], str] = {
    ("docs/debugging.md", "%%ddp --procs 2 --debug"): "AssertionError",
}
# Blocks that stop at a prompt, by page and a line of the block: the answers, in order.
ANSWERS: dict[tuple[str, str], list[str]] = {
    ("docs/debugging.md", "%%ddp --procs 2 --debug"): ["p loss", "c"],
}


def _keyed(table: Mapping[tuple[str, str], T], page: str, source: str) -> T | None:
    """The entry of ``table`` for this page's block, by one of its lines."""
    lines = source.splitlines()
    return next((v for (p, line), v in table.items() if p == page and line in lines), None)


@dataclass
class PageRun:
    """One page's run in its kernel: what ran, what was a sketch."""

    page: str
    kernel: Kernel
    executed: list[int] = field(default_factory=list)
    sketches: list[int] = field(default_factory=list)

    def evaluate(self, example: Example) -> str | None:
        """Sybil's evaluator for a ``python`` block: run it as a cell of the page's kernel;
        what went wrong, or None."""
        source = str(example.parsed)
        if source.lstrip().startswith(SKETCH):
            self.sketches.append(example.line)
            return None
        self.executed.append(example.line)
        raises = _keyed(RAISES, self.page, source)
        answers = list(_keyed(ANSWERS, self.page, source) or [])
        if answers:
            result, _ = self.kernel.execute_answering(
                source, lambda prompt, password: answers.pop(0) if answers else "c"
            )
        else:
            result = self.kernel.execute(source)
        if raises is None and result.status != "ok":
            return f"the block failed:\n{result.text()}"
        if raises is not None:
            error = result.error
            if error is None or error["ename"] != raises:
                return f"the block should raise {raises}:\n{result.text()}"
        return None


def _evaluate(example: Example) -> str | None:
    run: PageRun = example.namespace["page"]
    return run.evaluate(example)


def documents() -> list[Path]:
    return [p for p in PAGES if "```python" in p.read_text()]


def run_page(path: Path) -> PageRun:
    """Every ``python`` block of the page, in order, in one kernel."""
    page = str(path.relative_to(ROOT))
    document = Document.parse(str(path), CodeBlockParser("python", _evaluate))
    examples = list(document)
    with Kernel(cwd=str(ROOT)) as kernel:
        run = PageRun(page, kernel)
        document.namespace["page"] = run
        if any(not str(e.parsed).lstrip().startswith(SKETCH) for e in examples):
            for cell in SETUP.get(page, []):
                result = kernel.execute(cell)
                assert result.status == "ok", f"{page} set-up: {result.text()}"
        for example in examples:
            example.evaluate()
    return run


@pytest.mark.timeout(300)
@pytest.mark.parametrize("path", documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_python_block_runs_as_written(path: Path) -> None:
    run = run_page(path)
    print(f"{run.page}: {len(run.executed)} executed, {len(run.sketches)} sketches")
    assert len(run.executed) + len(run.sketches) == str(path.read_text()).count("```python")


def test_the_setup_names_only_pages_that_exist() -> None:
    pages = {str(p.relative_to(ROOT)) for p in documents()}
    named = set(SETUP) | {page for page, _ in RAISES} | {page for page, _ in ANSWERS}
    assert named <= pages, named - pages


def test_no_block_escapes_the_check_by_its_language() -> None:
    """Python or notebook code is fenced ``python``, the language the tests run."""
    other = re.compile(r"^\s*```(py|python3|ipython|ipython3|pycon|jupyter)\s*$", re.M)
    found = [
        f"{p.relative_to(ROOT)}: {m.group(0).strip()}"
        for p in PAGES
        for m in other.finditer(p.read_text())
    ]
    assert not found, found
