"""A call that cannot start shows in a kernel as one line, ``Class: message``, as a
``%%ddp`` cell's option errors do: no frame of nbddp's. ``%tb`` after it shows the whole
traceback, and the ``nbddp`` logger has it at debug level."""

from __future__ import annotations

import re

import pytest

from tests.kernel.kernel import CellResult, Kernel

SETUP = """
import threading, nbddp
def train(data=None, epochs=1):
    return epochs
"""


def shown(cell: CellResult) -> list[str]:
    """The failed cell's traceback lines as the notebook shows them, without colour."""
    assert cell.status == "error" and cell.error is not None, cell.text()
    return [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in cell.error["traceback"]]


@pytest.mark.parametrize(
    ("call", "line"),
    [
        ("nbddp.launch(train, procs=0)", "ConfigError: procs must be at least 1, got 0"),
        ("nbddp.launch(train, prcs=2)", "PayloadError: train() got an unexpected keyword"),
        ("nbddp.launch(train, epoch=3)", "did you mean epochs=3?"),
        ("nbddp.launch(train, threading.Lock(), procs=2)", "PayloadError: "),
        ("nbddp.spawn(train, nprocs=0)", "ConfigError: nprocs must be at least 1, got 0"),
        ("nbddp.notebook_launcher(train, num_processes=0)", "ConfigError: num_processes"),
        ("nbddp.Launcher(procs=0).run(train)", "ConfigError: procs must be at least 1, got 0"),
    ],
)
def test_a_call_that_cannot_start_is_one_line(kernel: Kernel, call: str, line: str) -> None:
    kernel.execute(SETUP)
    cell = kernel.execute(call)
    lines = shown(cell)
    assert len(lines) == 1 and line in lines[0], lines
    assert "nbddp/" not in lines[0]


def test_tb_after_it_shows_the_whole_traceback(kernel: Kernel) -> None:
    kernel.execute(SETUP)
    shown(kernel.execute("nbddp.launch(train, procs=0)"))
    whole = kernel.execute("%tb")
    text = re.sub(r"\x1b\[[0-9;]*m", "", whole.text())
    assert "nbddp/launcher/config.py" in text and "procs must be at least 1" in text, text


def test_the_logger_has_the_whole_traceback(kernel: Kernel) -> None:
    kernel.execute(SETUP + "import logging, io\n_log = io.StringIO()\n")
    kernel.execute(
        "_h = logging.StreamHandler(_log); logging.getLogger('nbddp').addHandler(_h)\n"
        "logging.getLogger('nbddp').setLevel(logging.DEBUG)"
    )
    shown(kernel.execute("nbddp.launch(train, procs=0)"))
    cell = kernel.execute("logging.getLogger('nbddp').removeHandler(_h); print(_log.getvalue())")
    assert "Traceback" in cell.stdout and "nbddp/launcher/config.py" in cell.stdout, cell.stdout
