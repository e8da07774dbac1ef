"""Debugging a rank from the notebook, in a real kernel with stdin (as JupyterLab runs it).

``breakpoint()`` and ``input()`` in a rank prompt in the cell, naming the rank,
one prompt at a time; ``getpass`` asks for a password; a prompt outlives ``--timeout``;
``--debug`` opens pdb on the frame that raised before the cell fails as usual (not for
``sys.exit``); ``%ddp_debug`` looks at a session's last failure; an interrupt at a prompt
leaves nothing (the conftest fixture checks every test for leftovers). A frontend
without stdin gets one line saying so; a rank's own ``KeyboardInterrupt`` keeps its message.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from tests.kernel.kernel import CellResult, Kernel, ok
from tests.kernel.test_session_kernel import KEPT, start_session
from tests.procs import ours, wait_gone


def answering(*answers: str) -> Callable[[str, bool], str | None]:
    """Answers each prompt with the next of ``answers``; then end of input ("")."""
    left = list(answers)
    return lambda prompt, password: left.pop(0) if left else ""


def shown(result: CellResult) -> str:
    return result.text()


def test_breakpoint_on_one_rank_prompts_in_the_cell_naming_it(notebook: Kernel) -> None:
    code = "%%ddp --procs 2\nx = 41 + rank\nif rank == 1:\n    breakpoint()\nprint('after', x)\n"
    result, prompts = notebook.execute_answering(code, answering("p x * 10", "c"))
    assert result.status == "ok", shown(result)
    assert prompts == ["(Pdb) [rank 1] ", "(Pdb) [rank 1] "], prompts
    output = result.rank_output
    assert re.search(r"^\[rank 1\] 420$", output, re.M), output  # pdb's answer, rank 1's block
    assert "after 41" in output and "after 42" in output, output


def test_input_reaches_its_rank_and_two_ranks_are_asked_one_after_the_other(
    notebook: Kernel,
) -> None:
    code = "%%ddp --procs 2\nname = input('who? ')\nprint('hello', name, 'from', rank)\n"
    answers = {"who? [rank 0] ": "alice", "who? [rank 1] ": "bob"}
    result, prompts = notebook.execute_answering(code, lambda prompt, _: answers[prompt])
    assert result.status == "ok", shown(result)
    assert sorted(prompts) == sorted(answers), prompts  # each once, in the order asked
    assert "hello alice from 0" in result.rank_output
    assert "hello bob from 1" in result.rank_output


def test_getpass_in_a_rank_asks_the_notebook_for_a_password(notebook: Kernel) -> None:
    asked: list[tuple[str, bool]] = []

    def respond(prompt: str, password: bool) -> str:
        asked.append((prompt, password))
        return "s3cret"

    code = "%%ddp --procs 2\nimport getpass\nif rank == 1:\n    print(len(getpass.getpass()))\n"
    result, _ = notebook.execute_answering(code, respond)
    assert result.status == "ok", shown(result)
    assert asked == [("Password: [rank 1] ", True)], asked
    assert re.search(r"^\[rank 1\] 6$", result.rank_output, re.M), result.rank_output
    assert "s3cret" not in result.text() and "GetPassWarning" not in result.text(), shown(result)


def test_a_frontend_without_stdin_gets_one_line_saying_so(notebook: Kernel) -> None:
    for code in ("input('who? ')", "breakpoint()"):
        result = notebook.execute(
            f"%%ddp --procs 2\nif rank == 1:\n    {code}\n", allow_stdin=False
        )
        assert result.status == "error" and result.error is not None, shown(result)
        assert result.error["ename"] == "NoStdinError", shown(result)
        assert "input is not available in this frontend" in result.error["evalue"]
        assert "%ddp_debug" in result.error["evalue"] and "JupyterLab" in result.error["evalue"]


def test_a_ranks_own_keyboard_interrupt_keeps_its_message(notebook: Kernel) -> None:
    code = "%%ddp --procs 2\nif rank == 1:\n    raise KeyboardInterrupt('kbd-in-rank')\n"
    result = notebook.execute(code)
    assert result.status == "error" and result.error is not None, shown(result)
    assert result.error["ename"] == "KeyboardInterrupt", shown(result)
    assert "KeyboardInterrupt: kbd-in-rank" in "\n".join(result.error["traceback"]), shown(result)
    assert "every rank was stopped" not in shown(result), shown(result)


def test_a_prompt_outlives_the_timeout(notebook: Kernel) -> None:
    asked: list[float] = []

    def late(prompt: str, password: bool) -> str | None:
        # The user takes longer to answer than --timeout allows the whole run.
        if not asked:
            asked.append(time.monotonic())
        return "go" if time.monotonic() - asked[0] > 4.0 else None

    code = "%%ddp --procs 2 --timeout 2\nif rank == 0:\n    print('got', input('ready? '))\n"
    result, prompts = notebook.execute_answering(code, late)
    assert result.status == "ok", shown(result)
    assert prompts == ["ready? [rank 0] "]
    assert "got go" in result.rank_output


def test_debug_opens_pdb_on_the_frame_that_raised_then_the_cell_fails_as_usual(
    notebook: Kernel,
) -> None:
    code = (
        "%%ddp --procs 2 --debug\n"
        "def check(v):\n"
        "    secret = v * 7\n"
        "    raise ValueError('bad batch')\n"
        "if rank == 1:\n"
        "    check(6)\n"
    )
    result, prompts = notebook.execute_answering(code, answering("p secret", "q"))
    assert result.status == "error" and result.error is not None, shown(result)
    assert result.error["ename"] == "ValueError", shown(result)
    assert prompts and all(p == "(Pdb) [rank 1] " for p in prompts), prompts
    assert re.search(r"^\[rank 1\] 42$", result.rank_output, re.M), result.rank_output


def test_launch_with_debug_opens_pdb_on_the_failing_rank(notebook: Kernel) -> None:
    ok(
        notebook,
        "import nbddp\n"
        "def train(scale):\n"
        "    import torch.distributed as dist\n"
        "    loss = dist.get_rank() * scale\n"
        "    if dist.get_rank() == 1:\n"
        "        raise RuntimeError('nan loss')\n"
        "    return loss",
    )
    code = "nbddp.launch(train, 5, procs=2, init_process_group=True, debug=True)"
    result, prompts = notebook.execute_answering(code, answering("p loss", "c"))
    assert result.status == "error" and result.error is not None, shown(result)
    assert result.error["ename"] == "RuntimeError", shown(result)
    assert prompts[0] == "(Pdb) [rank 1] ", prompts
    assert re.search(r"^\[rank 1\] 5$", result.rank_output, re.M), result.rank_output


def test_pdb_in_a_launched_rank_lists_the_notebook_lines_and_the_error_hides_nbddp(
    notebook: Kernel,
) -> None:
    ok(
        notebook,
        "import nbddp\n"
        "def step(batch):\n"
        "    import torch.distributed as dist\n"
        "    if dist.get_rank() == 1:\n"
        "        raise RuntimeError(f'bad batch {batch}')\n",
    )
    code = "nbddp.launch(step, 3, procs=2, init_process_group=True, debug=True)"
    result, prompts = notebook.execute_answering(code, answering("l", "c"))
    assert result.status == "error" and result.error is not None, shown(result)
    assert prompts[0] == "(Pdb) [rank 1] ", prompts
    # pdb lists the function's own lines: they came with the call.
    assert "raise RuntimeError(f'bad batch {batch}')" in result.rank_output, result.rank_output
    # The error the cell shows after pdb: the function's cell and line, none of nbddp's frames.
    error = "\n".join(result.error["traceback"])
    assert re.search(r"Cell In\[\d+\], line 5, in step", error), error
    assert "nbddp/" not in error, error


def test_debug_needs_a_run_that_blocks(notebook: Kernel) -> None:
    result = notebook.execute("nbddp.launch(train, 5, procs=2, debug=True, block=False)")
    assert result.status == "error" and result.error is not None
    assert "debug=True needs block=True" in result.error["evalue"]


def test_ddp_debug_looks_at_the_sessions_last_failure_and_keeps_the_state(
    notebook: Kernel,
) -> None:
    pids = start_session(notebook)
    try:
        failed = notebook.execute(
            "%%ddp\nkept = 'state'\ndef step():\n    local = 'inside ' + str(rank)\n"
            "    raise KeyError(local)\nif rank == 1:\n    step()\n"
        )
        assert failed.status == "error"
        wrong = notebook.execute("%ddp_debug --rank 0")
        assert wrong.status == "error", wrong.text()
        assert "rank 0 did not raise in the last cell; ranks that did: 1" in wrong.stderr
        result, prompts = notebook.execute_answering("%ddp_debug", answering("p local", "c"))
        assert result.status == "ok", shown(result)
        assert prompts[0] == "(Pdb) [rank 1] ", prompts
        assert "inside 1" in result.text()
        assert ok(notebook, "%%ddp\nkept").result == "'state'"
        nothing = notebook.execute("%ddp_debug")
        assert nothing.status == "error" and "did not raise" in nothing.stderr, nothing.text()
        for code in (3, 0):  # as in a run, sys.exit opens no debugger
            exited, prompts = notebook.execute_answering(
                f"%%ddp --debug\nimport sys\nif rank == 1:\n    sys.exit({code})\n", answering("q")
            )
            assert exited.status == "error" and prompts == [], (prompts, shown(exited))
    finally:
        ok(notebook, "%ddp_session stop")
    assert wait_gone(pids=set(pids.values())) == []


def test_an_interrupt_at_a_prompt_ends_the_run_and_leaves_nothing() -> None:
    interrupted: list[bool] = []
    with Kernel() as kernel:
        ok(kernel, "%load_ext nbddp")

        def interrupt(prompt: str, password: bool) -> None:
            if not interrupted:
                interrupted.append(True)
                kernel.interrupt()
            return None

        code = "%%ddp --procs 2\nif rank == 0:\n    breakpoint()\nimport time\ntime.sleep(60)\n"
        result, prompts = kernel.execute_answering(code, interrupt)
        assert result.status == "error" and result.error is not None, shown(result)
        assert result.error["ename"] == "KeyboardInterrupt", shown(result)
        assert prompts == ["(Pdb) [rank 0] "]
        assert "every rank was stopped" in shown(result)
        assert ours(("worker",), pids=kernel.descendants()) == []


def test_an_interrupt_at_a_prompt_in_a_session_ends_the_cell_and_keeps_the_state() -> None:
    interrupted: list[bool] = []
    with Kernel() as kernel:
        pids = start_session(kernel)
        ok(kernel, "%%ddp\nkept = 1")

        def interrupt(prompt: str, password: bool) -> None:
            if not interrupted:
                interrupted.append(True)
                kernel.interrupt()
            return None

        result, prompts = kernel.execute_answering(
            "%%ddp\nif rank == 1:\n    breakpoint()\n", interrupt
        )
        assert result.status == "error", shown(result)
        assert prompts == ["(Pdb) [rank 1] "]
        assert KEPT in shown(result), shown(result)
        assert ok(kernel, "%%ddp\nkept + 1").result == "2"
        ok(kernel, "%ddp_session stop")
        assert wait_gone(pids=set(pids.values())) == []


def test_torch_distributed_breakpoint_prompts_in_the_cell_while_the_other_rank_waits(
    notebook: Kernel,
) -> None:
    # torch's own distributed breakpoint: pdb on the rank asked for, the others wait in a
    # barrier until it continues. It stops inside torch, so "up" reaches the cell's frame.
    code = (
        "%%ddp --procs 2\n"
        "import torch.distributed as dist\n"
        "x = 41 + rank\n"
        "dist.breakpoint(rank=1)\n"
        "print('after', x, dist.get_world_size())\n"
    )
    result, prompts = notebook.execute_answering(code, answering("up", "p x * 10", "c"))
    assert result.status == "ok", shown(result)
    assert prompts == ["(Pdb) [rank 1] "] * 3, prompts
    output = result.rank_output
    assert "Type 'up' to get to the frame that called dist.breakpoint(rank=1)" in output, output
    assert re.search(r"^\[rank 1\] 420$", output, re.M), output
    assert re.search(r"^\[rank 0\] after 41 2$", output, re.M), output
    assert re.search(r"^\[rank 1\] after 42 2$", output, re.M), output
