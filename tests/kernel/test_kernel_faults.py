"""When the notebook goes away mid-run (interrupt, restart, SIGKILL), every worker and
every worker's child is gone within 5 seconds, and after an interrupt the kernel works.
What a failure or an interrupt shows reads like the notebook's own code's: the cell
named as IPython names it, its lines, no frame of nbddp's, one line for an interrupt."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import psutil
import pytest

from tests.kernel.kernel import CellResult, Kernel
from tests.procs import wait_gone, wait_procs_gone
from tests.sources import FAILING_TRAIN

HANG = """
import os, threading, nbddp
def hang():
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    it = iter(DataLoader(TensorDataset(torch.zeros(8)), num_workers=1))
    next(it)
    print("ready", os.getpid(), flush=True)
    threading.Event().wait()
nbddp.launch(hang, procs=2)
"""


def start_hanging_run(kernel: Kernel) -> tuple[str, list[psutil.Process]]:
    """Run HANG in the kernel until both ranks say ready; return the cell id and the
    ranks with their children. The ranks' output arrives as the display's per-rank
    blocks (display and update messages) or, in a plain terminal, as stream text."""
    msg_id = kernel.kc.execute(HANG)
    pids: set[int] = set()
    for msg in kernel.messages_of(msg_id, 60, "the ranks did not both say ready"):
        content = msg["content"]
        if msg["msg_type"] == "stream":
            text = content["text"]
        elif msg["msg_type"] in ("display_data", "update_display_data"):
            text = content.get("data", {}).get("text/plain", "")
        else:
            continue
        pids.update(int(pid) for pid in re.findall(r"ready (\d+)", text))
        if len(pids) == 2:
            break
    ranks = [psutil.Process(pid) for pid in sorted(pids)]
    tree = ranks + [c for r in ranks for c in r.children(recursive=True)]
    assert len(tree) == 4  # 2 ranks, one DataLoader worker each
    return msg_id, tree


@pytest.fixture
def kernel() -> Iterator[Kernel]:
    """A kernel of the test's own (the test ends or disturbs it)."""
    with Kernel() as k:
        yield k


def test_interrupt_stops_every_rank_and_the_kernel_goes_on(kernel: Kernel) -> None:
    msg_id, tree = start_hanging_run(kernel)
    kernel.interrupt()
    cell = kernel.collect(msg_id)
    assert cell.status == "error"
    assert cell.error is not None and cell.error["ename"] == "KeyboardInterrupt"
    # One line saying what happened, not a traceback through nbddp's frames.
    (line,) = cell.error["traceback"]
    assert re.fullmatch(
        r"KeyboardInterrupt: every rank was stopped; their output is in /\S+/run-\S+", line
    ), line
    assert wait_procs_gone(tree, timeout=5.0) == []
    again = kernel.execute("nbddp.launch(lambda: 'fine', procs=2, output='none')")
    assert again.status == "ok" and "'fine'" in again.text()


def test_kernel_restart_takes_every_rank_down(kernel: Kernel) -> None:
    _, tree = start_hanging_run(kernel)
    kernel.km.restart_kernel(now=True)
    assert wait_procs_gone(tree, timeout=5.0) == []


def test_kernel_killed_takes_every_rank_down(kernel: Kernel) -> None:
    _, tree = start_hanging_run(kernel)
    kernel.kill()
    assert wait_procs_gone(tree, timeout=5.0) == []


def test_ddp_status_stacks_dumps_a_running_launch(kernel: Kernel) -> None:
    started = kernel.execute(
        "%load_ext nbddp\n"
        "import threading, nbddp\n"
        "def stuck():\n"
        "    print('ready', flush=True)\n"
        "    threading.Event().wait()\n"
        "run = nbddp.launch(stuck, procs=2, block=False, output='none')\n"
        "run.wait(timeout=0.01) if False else None\n"
    )
    assert started.status == "ok", started.text()
    status = kernel.execute("%ddp_status --stacks")
    assert status.status == "ok"
    assert "latest run:" in status.stdout
    assert "stacks requested" in status.stdout or "starting" in status.stdout
    stopped = kernel.execute(
        "run.stop()\ntry:\n    run.wait()\nexcept nbddp.RankError:\n    pass\nprint(run.status)"
    )
    assert "stopped" in stopped.stdout
    bad = kernel.execute("%ddp_status --nope")
    assert bad.status == "error" and "only --stacks" in bad.text()


FIRST_LAUNCH_SETUP = """
import threading, torch.distributed, nbddp
from tests.multiproc import escape_fns
from tests.procs import fd_targets
# What a process's first launch creates once (the relay's thread and fds) exists
# before counting; spawn leaves the forkserver unstarted (prewarm is off).
assert nbddp.launch(escape_fns.noop, procs=1, output="none", start_method="spawn") == 0
def held():
    return threading.active_count(), fd_targets()  # a mismatch names what was left
before = held()
"""


def test_an_interrupt_while_the_forkserver_starts_leaves_nothing_in_the_kernel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NBDDP_PREWARM", "0")
    with Kernel() as kernel:
        assert kernel.execute(FIRST_LAUNCH_SETUP).status == "ok"
        msg_id = kernel.kc.execute(
            "nbddp.launch(escape_fns.setsid_child_holding_pipes, procs=2, output='none')"
        )
        # Interrupt as soon as the forkserver exists: it is still importing torch.
        deadline = time.monotonic() + 60
        while not any(_is_forkserver(pid) for pid in kernel.descendants()):
            assert time.monotonic() < deadline, "the forkserver never started"
            psutil.wait_procs([psutil.Process(kernel.pid)], timeout=0.01)
        kernel.interrupt()
        cell = kernel.collect(msg_id)
        assert cell.error is not None and cell.error["ename"] == "KeyboardInterrupt"
        (line,) = cell.error["traceback"]
        assert line.startswith("KeyboardInterrupt: interrupted while the ranks were starting")
        # Two cells later: a launch works, and once nbddp shuts its forkserver down
        # the kernel holds exactly the threads and fds it held before.
        again = kernel.execute("nbddp.launch(escape_fns.noop, procs=2, output='none')")
        assert again.status == "ok" and again.result == "0", again.text()
        check = kernel.execute(
            "nbddp.shutdown()\nafter = held()\nassert after == before, (before, after)"
        )
        assert check.status == "ok", check.text()


def test_an_interrupt_in_the_first_ddp_cell_leaves_no_process_after_shutdown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NBDDP_PREWARM", "0")
    with Kernel() as kernel:
        assert kernel.execute("%load_ext nbddp").status == "ok"
        msg_id = kernel.kc.execute("%%ddp --procs 2\nprint('hello from', rank)\n")
        # Interrupt as soon as the forkserver exists: it is still importing torch.
        deadline = time.monotonic() + 60
        while not any(_is_forkserver(pid) for pid in kernel.descendants()):
            assert time.monotonic() < deadline, "the forkserver never started"
            psutil.wait_procs([psutil.Process(kernel.pid)], timeout=0.01)
        kernel.interrupt()
        cell = kernel.collect(msg_id)
        assert cell.error is not None and cell.error["ename"] == "KeyboardInterrupt"
        started = kernel.descendants()  # the forkserver among them
    assert wait_gone(("worker", "forkserver", "idle"), timeout=10.0, pids=started) == []


def _is_forkserver(pid: int) -> bool:
    try:
        return "nbddp.forkserver.server" in " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return False


TRAIN = FAILING_TRAIN
NBDDP_FRAMES = re.compile(r"nbddp/(rank|launcher|entry|notebook|wire)|entry\.py|run\.py|_pump")


def shown_error(cell: CellResult) -> str:
    """The failed cell's traceback as the notebook shows it, without colour codes."""
    assert cell.status == "error" and cell.error is not None, cell.text()
    return re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(cell.error["traceback"]))


def test_a_launched_notebook_function_fails_with_its_cells_name_and_line(kernel: Kernel) -> None:
    defined = kernel.execute(TRAIN)
    assert defined.status == "ok", defined.text()
    number = defined.reply["execution_count"]
    shown = shown_error(
        kernel.execute("import nbddp\nnbddp.launch(train, 10_000, procs=2, output='none')")
    )
    raised = 'raise ValueError("bad batch on rank 1")'
    assert f"  Cell In[{number}], line 7, in train\n    {raised}" in shown
    assert shown.count("Traceback (most recent call last)") == 1
    assert not NBDDP_FRAMES.search(shown), shown
    assert re.search(r"^rank 0: stopped (in a collective )?after rank 1 failed", shown, re.M)
    assert re.search(r"^full output in /\S+/rank1\.log$", shown, re.M)


def test_a_failing_ddp_cell_names_its_own_cell_and_says_why_the_other_rank_stopped(
    kernel: Kernel,
) -> None:
    assert kernel.execute("%load_ext nbddp").status == "ok"
    cell = kernel.execute(
        "%%ddp --procs 2\n"
        "import torch\n"
        "import torch.distributed as dist\n"
        "t = torch.ones(1)\n"
        "if rank == 1:\n"
        "    raise ValueError('boom on rank 1')\n"
        "for _ in range(10_000):\n"
        "    dist.all_reduce(t)\n"
    )
    shown = shown_error(cell)
    number = cell.reply["execution_count"]  # the prompt the notebook shows: In [number]
    raised = "raise ValueError('boom on rank 1')"
    assert f"  Cell In[{number}], line 6, in <module>\n    {raised}" in shown
    assert not NBDDP_FRAMES.search(shown), shown
    (other,) = [line for line in shown.split("\n") if line.startswith("rank 0:")]
    # The backend's own text (its source path, its sign-off, its emoji) stays in the log.
    assert re.fullmatch(
        r"rank 0: stopped (in a collective )?after rank 1 failed"
        r"( \(gloo: connection (closed|reset) by peer\))?",
        other,
    ), other
    assert "pair.cc" not in shown and "GLHF" not in shown and shown.isascii()


def test_a_ddp_cell_calling_an_earlier_cells_function_shows_that_cells_line(
    kernel: Kernel,
) -> None:
    assert kernel.execute("%load_ext nbddp").status == "ok"
    defined = kernel.execute(
        "def check(rank):\n"
        "    def inner(value):\n"
        "        if value == 1:\n"
        "            raise ValueError(f'bad rank {value}')\n"
        "    inner(rank)\n"
    )
    assert defined.status == "ok", defined.text()
    number = defined.reply["execution_count"]
    cell = kernel.execute("%%ddp --procs 2 --no-init\ncheck(rank)\n")
    shown = shown_error(cell)
    here = cell.reply["execution_count"]
    # Every frame of the notebook's code: its cell, its line, the line's text.
    assert f"  Cell In[{here}], line 2, in <module>\n    check(rank)\n" in shown
    assert f"  Cell In[{number}], line 5, in check\n    inner(rank)\n" in shown
    raised = "raise ValueError(f'bad rank {value}')"
    assert f"  Cell In[{number}], line 4, in inner\n    {raised}\n" in shown
    assert "<dynamic-code>" not in shown and not NBDDP_FRAMES.search(shown), shown
