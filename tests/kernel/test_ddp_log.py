"""``%ddp_log`` in a real kernel: a rank's log of the latest run, or of the session.

One kernel serves the module; the first test runs before anything has started.
"""

from __future__ import annotations

import pytest

from tests.kernel.kernel import CellResult, Kernel

KERNEL_SETUP = ("import nbddp\n%load_ext nbddp",)


def shown(result: CellResult) -> dict[str, str]:
    """The bundle the magic displayed."""
    assert result.status == "ok", result.text()
    [message] = result.of_type("display_data")
    data: dict[str, str] = message["content"]["data"]
    return data


def one_line_error(result: CellResult) -> str:
    """The ``UsageError`` line a magic's misuse shows, checked to be one line."""
    text = result.text()
    assert "Traceback" not in text and "UsageError: " in text, text
    line = text[text.index("UsageError: ") :].strip()
    assert "\n" not in line, text
    return line


def test_before_any_run_it_says_there_is_none(kernel: Kernel) -> None:
    line = one_line_error(kernel.execute("%ddp_log"))
    assert line == "UsageError: %ddp_log: no run has started in this kernel yet"


def test_it_shows_a_ranks_log_of_the_latest_run(kernel: Kernel) -> None:
    code = (
        "def talk():\n"
        "    import os\n"
        "    for i in range(5):\n"
        "        print(f\"rank {os.environ['RANK']} line {i}\")\n"
        "nbddp.launch(talk, procs=2)"
    )
    assert kernel.execute(code).status == "ok"
    whole = shown(kernel.execute("%ddp_log 1"))
    first, _, body = whole["text/plain"].partition("\n")
    assert first.startswith("rank 1 of the latest run: ") and first.endswith("1.log")
    assert body.splitlines() == [f"rank 1 line {i}" for i in range(5)]
    tail = shown(kernel.execute("%ddp_log --tail 2"))
    first, _, body = tail["text/plain"].partition("\n")
    assert first.startswith("rank 0 of the latest run (last 2 lines): ")
    assert body.splitlines() == ["rank 0 line 3", "rank 0 line 4"]
    assert "rank 0 line 4" in tail["text/html"] and "<pre" in tail["text/html"]


def test_its_tail_shows_a_progress_bar_as_a_terminal_does(kernel: Kernel) -> None:
    code = (
        "def bar():\n"
        "    import sys\n"
        "    for epoch in range(3):\n"
        "        for i in range(50):\n"
        "            sys.stderr.write(f'\\repoch {epoch}: {i * 2}%')\n"
        "        sys.stderr.write(f'\\repoch {epoch}: 100%\\n')\n"
        "        print(f'epoch {epoch} finished', flush=True)\n"
        "nbddp.launch(bar, procs=2)"
    )
    assert kernel.execute(code).status == "ok"
    tail = shown(kernel.execute("%ddp_log 1 --tail 3"))
    first, _, body = tail["text/plain"].partition("\n")
    assert first.startswith("rank 1 of the latest run (last 3 lines): ")
    assert body.splitlines() == ["epoch 1 finished", "epoch 2: 100%", "epoch 2 finished"]
    assert "\r" not in tail["text/html"] and "98%" not in tail["text/html"]


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ("%ddp_log 2", "%ddp_log: rank 2: the latest run's ranks are 0 to 1"),
        ("%ddp_log --tail -3", "%ddp_log: --tail -3: give a number of lines, 0 or more"),
        ("%ddp_log one", "%ddp_log: argument rank: invalid int value: 'one'"),
    ],
)
def test_a_bad_rank_or_tail_is_one_line(kernel: Kernel, line: str, error: str) -> None:
    assert kernel.execute("nbddp.launch(print, procs=2)").status == "ok"
    assert one_line_error(kernel.execute(line)).startswith(f"UsageError: {error}")


def test_help_says_what_it_shows(kernel: Kernel) -> None:
    result = kernel.execute("%ddp_log --help")
    assert "--tail N" in result.text() and "session" in result.text(), result.text()
