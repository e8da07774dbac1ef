"""``%%ddp`` in a real kernel: output, names in and out, errors, options, status.

One kernel serves the whole module (loading the extension and warming the
forkserver once); every test leaves the kernel's state as it found it.
Interrupts and shutdown, which end or disturb a kernel, are in
``test_magic_lifecycle.py``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.kernel.kernel import CellResult, Kernel, ok

SETUP = """\
import threading
import numpy as np
import torch
import torch.distributed as dist

scale = 3
data = np.arange(4)
lock = threading.Lock()  # cannot be pickled: fine as long as no cell reads it


def helper(x):
    return x * scale
"""
KERNEL_SETUP = ("%load_ext nbddp", SETUP)


def failed(kernel: Kernel, code: str) -> CellResult:
    result = kernel.execute(code)
    assert result.status == "error", result.text()
    return result


def test_output_from_every_rank(kernel: Kernel) -> None:
    result = ok(
        kernel, "%%ddp --procs 2\nprint(f'hello from rank {rank} of {world_size} on {device}')"
    )
    for rank in (0, 1):
        assert f"[rank {rank}] hello from rank {rank} of 2 on cpu\n" in result.rank_output


def test_output_rank0_shows_only_rank_0(kernel: Kernel) -> None:
    result = ok(kernel, "%%ddp --procs 2 --output rank0\nprint('hello from', rank)")
    assert "[rank 0] hello from 0\n" in result.rank_output
    assert "hello from 1" not in result.text()


def test_timeout_stops_the_run(kernel: Kernel) -> None:
    cell = "%%ddp --procs 2 --timeout 0.5\nimport threading\nthreading.Event().wait()"
    error = failed(kernel, cell).error
    assert error is not None and error["ename"] == "LaunchTimeout"
    assert "timeout of 0.5s" in error["evalue"]
    assert error["traceback"] == [f"LaunchTimeout: {error['evalue']}"]  # no local frames


def test_notebook_names_the_cell_reads_reach_every_rank(kernel: Kernel) -> None:
    # helper reads the notebook's `scale`; `lock` is not read, so not sent.
    result = ok(kernel, "%%ddp --procs 2\nprint('sum', helper(data).sum() + rank)")
    assert "[rank 0] sum 18\n" in result.rank_output
    assert "[rank 1] sum 19\n" in result.rank_output


def test_an_unpicklable_name_the_cell_reads_is_named(kernel: Kernel) -> None:
    result = failed(kernel, "%%ddp --procs 2\nprint(lock)")
    assert result.error is not None
    assert result.error["ename"] == "PayloadError"
    assert "the notebook name 'lock'" in result.error["evalue"]
    assert len(result.error["traceback"]) == 1


def test_out_names_and_last_expression_come_back_from_rank_0(kernel: Kernel) -> None:
    result = ok(
        kernel,
        "%%ddp --procs 2 --out weights,info\n"
        "weights = torch.arange(3.0) + rank\n"
        "info = {'rank': rank, 'world': world_size}\n"
        "rank + 40\n",
    )
    assert result.result == "40"
    check = ok(kernel, "type(weights).__name__, weights.tolist(), info")
    assert check.result == "('Tensor', [0.0, 1.0, 2.0], {'rank': 0, 'world': 2})"


def test_a_trailing_semicolon_hides_the_result(kernel: Kernel) -> None:
    assert ok(kernel, "%%ddp --procs 2\nrank + 40;").result is None


def test_ten_cells_in_a_row_each_with_a_ready_process_group(kernel: Kernel) -> None:
    for i in range(10):
        result = ok(
            kernel,
            f"%%ddp --procs 2\nt = torch.tensor([rank + {i}.0])\ndist.all_reduce(t)\nt.item()",
        )
        assert result.result == str(float(2 * i + 1))


def test_no_init_leaves_the_process_group_to_the_cell(kernel: Kernel) -> None:
    result = ok(
        kernel,
        "%%ddp --procs 2 --no-init\n"
        "before = dist.is_initialized()\n"
        "dist.init_process_group('gloo')\n"
        "before, dist.get_world_size()\n",
    )
    assert result.result == "(False, 2)"


def test_an_error_fails_the_cell_with_the_ranks_traceback_once(kernel: Kernel) -> None:
    result = failed(
        kernel,
        "%%ddp --procs 2\n"
        "x = 1\n"
        "if rank == 1:\n"
        "    raise ValueError(f'bad value on rank {rank}')\n"
        "print('rank', rank, 'done')\n",
    )
    error = result.error
    assert error is not None
    assert (error["ename"], error["evalue"]) == ("ValueError", "bad value on rank 1")
    shown = "\n".join(error["traceback"])
    assert re.search(r"Cell In\[\d+\], line 4, in <module>", shown)
    assert "raise ValueError(f'bad value on rank {rank}')" in shown
    assert "raised on rank 1 of 2" in shown
    everything = result.text()
    assert everything.count("Traceback (most recent call last)") == 1
    assert everything.count("raise ValueError") == 1
    for local in ("magics.py", "session.py", "worker.py", "interactiveshell.py"):
        assert local not in everything


def test_an_error_on_every_rank_is_shown_once(kernel: Kernel) -> None:
    result = failed(kernel, "%%ddp --procs 2\nraise RuntimeError('everywhere')")
    everything = result.text()
    assert everything.count("Traceback (most recent call last)") == 1
    assert everything.count("RuntimeError: everywhere") == 1
    assert re.search(r"^rank \d: the same error$", everything, re.M)
    ok(kernel, "%%ddp --procs 2\nrank")  # the kernel goes on


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("--bogus", "UsageError: %%ddp: unrecognized arguments: --bogus"),
        ("--procs 0", "UsageError: --procs must be at least 1, got 0"),
        ("--gpus 0,0", "UsageError: "),
    ],
)
def test_bad_options_are_a_one_line_error(kernel: Kernel, line: str, message: str) -> None:
    result = failed(kernel, f"%%ddp {line}\nx = 1")
    assert result.error is None  # no traceback at all
    assert result.stderr.startswith(message)
    assert result.stderr.count("\n") == 1


def test_an_empty_cell_is_a_clear_error(kernel: Kernel) -> None:
    result = failed(kernel, "%%ddp --procs 2\n# nothing here yet\n")
    assert result.stderr.startswith("UsageError: %%ddp: the cell is empty")


def test_a_syntax_error_shows_the_cells_line(kernel: Kernel) -> None:
    result = failed(kernel, "%%ddp --procs 2\nx = 1\ny = = 2\n")
    assert result.error is not None
    shown = "\n".join(result.error["traceback"])
    assert re.search(r"Cell In\[\d+\], line 3", shown)
    assert "y = = 2" in shown and "SyntaxError: invalid syntax" in shown
    assert "interactiveshell.py" not in shown


def test_help(kernel: Kernel) -> None:
    result = ok(kernel, "%%ddp?")
    page = "".join(p["data"]["text/plain"] for p in result.reply.get("payload", []))
    for option in ("--gpus", "--procs", "--out", "--no-init", "--timeout", "--env"):
        assert option in page


def test_ddp_status_shows_the_last_run(kernel: Kernel) -> None:
    ok(kernel, "%%ddp --procs 2\nrank")
    status = ok(kernel, "%ddp_status").stdout
    assert status.startswith("latest run: done after ")
    assert re.search(r"rank 0: done +pid \d+ +exit code 0", status)
    assert re.search(r"rank 1: done +pid \d+ +exit code 0", status)
    log_dir = re.search(r"log dir: (.+)", status)
    assert log_dir is not None and Path(log_dir.group(1)).is_dir()

    failed(kernel, "%%ddp --procs 2\nraise SystemExit(3)")
    status = ok(kernel, "%ddp_status").stdout
    assert status.startswith("latest run: failed")
    assert "exit code 3" in status


def test_ddp_config_sets_session_defaults(kernel: Kernel) -> None:
    assert "no session defaults" in ok(kernel, "%ddp_config").stdout
    ok(kernel, "%ddp_config --procs 1 --env NBDDP_MAGIC_TEST=on")
    try:
        shown = ok(kernel, "%ddp_config").stdout
        assert shown == "%ddp_config --procs 1 --env NBDDP_MAGIC_TEST=on\n"
        used = ok(kernel, "%%ddp\nimport os\nworld_size, os.environ['NBDDP_MAGIC_TEST']")
        assert used.result == "(1, 'on')"
        assert ok(kernel, "%%ddp --procs 2\nworld_size").result == "2"  # the cell's own wins
        bad = failed(kernel, "%ddp_config --procs 0")
        assert bad.stderr == "UsageError: --procs must be at least 1, got 0\n"
        ok(kernel, "%load_ext nbddp")  # a second load keeps the session
        assert "--procs 1" in ok(kernel, "%ddp_config").stdout
    finally:
        ok(kernel, "%ddp_config --reset")
    assert "no session defaults" in ok(kernel, "%ddp_config").stdout


def test_a_comment_after_the_options_is_ignored_as_pasted_from_the_docs(kernel: Kernel) -> None:
    line = "%ddp_config --procs 2 --timeout 600     # defaults for every %%ddp cell"
    try:
        assert ok(kernel, line).stdout == "%ddp_config --procs 2 --timeout 600\n"
        assert ok(kernel, "%%ddp --procs 1  # one rank, this cell only\nworld_size").result == "1"
        assert ok(kernel, "%ddp_config --env 'NOTE=a # b'").stdout.endswith("--env 'NOTE=a # b'\n")
    finally:
        ok(kernel, "%ddp_config --reset")


def test_a_cell_chooses_how_many_lines_each_block_shows(kernel: Kernel) -> None:
    result = ok(kernel, "%%ddp --procs 2 --tail 3\nfor i in range(10):\n    print('line', i)")
    shown = [line for line in result.rank_output.splitlines() if line.startswith("[rank 0]")]
    assert shown == ["[rank 0] line 7", "[rank 0] line 8", "[rank 0] line 9"], shown
    assert "--tail N" in str(ok(kernel, "%%ddp?").reply)  # the help, in the pager


def test_ddp_panel_shows_a_panel_preset_from_its_options(kernel: Kernel) -> None:
    ok(kernel, "def work():\n    return 7")
    result = ok(kernel, "%ddp_panel work --procs 3 --timeout 9 --env A=1")
    views = [
        m
        for m in result.of_type("display_data")
        if "application/vnd.jupyter.widget-view+json" in m["content"]["data"]
    ]
    assert len(views) == 1  # shown once, not again as the cell's result
    shown = ok(kernel, "p = _\nprint(p.settings().procs, p.settings().timeout, p.code()[1])")
    assert "3 9 result = nbddp.launch(work, procs=3, timeout=9, env={'A': '1'})" in shown.stdout
    done = ok(kernel, "p.launch()\nprint('value', p.wait(60).values)")
    assert "value {0: 7, 1: 7, 2: 7}" in done.stdout
    ok(kernel, "p.close()\ndel p, work")


def test_the_panels_ddp_cell_pasted_keeps_a_big_value_by_name_without_printing_it(
    kernel: Kernel,
) -> None:
    ok(kernel, "def big():\n    return {f'layer{i}.weight': [0.5] * 50 for i in range(200)}")
    ok(kernel, "import nbddp\np = nbddp.panel(big)")
    magic = ok(kernel, "print(p.code()[0])").stdout.strip()
    pasted = ok(kernel, magic)
    assert pasted.result is None, pasted.result  # no Out: the value is not echoed
    assert "layer199" not in pasted.text()
    assert ok(kernel, "print(len(result), result['layer3.weight'][0])").stdout == "200 0.5\n"
    ok(kernel, "p.close()\ndel p, big, result, nbddp")


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("%ddp_panel", "the following arguments are required: function"),
        ("%ddp_panel nothere", "the notebook has no name 'nothere'"),
        ("%ddp_panel scale", "int, not a function: 'scale'"),
        ("%ddp_panel helper --procs zero", "invalid int value"),
    ],
)
def test_ddp_panel_usage_errors_are_one_line(kernel: Kernel, line: str, says: str) -> None:
    shown = failed(kernel, line).stderr
    assert shown.startswith("UsageError: ") and shown.count("\n") == 1, shown
    assert says in shown
