"""``%ddp_session`` in a real kernel: ranks that keep their state from cell to cell.

The workflow (build, train, evaluate in three cells), the name rule, failures that
keep the state and those that end the session, interrupt, stop and restart, and the
kernel going away with a session running. Tests that only run cells share one kernel
and its session (each leaves it alive and idle); a test that ends or disturbs the
session or the kernel has a kernel of its own. Every test that ends ranks checks
their pids are gone (the conftest fixture checks the rest).
"""

from __future__ import annotations

import os
import re
import select
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.kernel.kernel import CellResult, Kernel, ok
from tests.procs import ours, wait_gone, wait_procs_gone

START = "%ddp_session start --procs 2"
ENDED = re.compile(r"the session has ended \((.+?)\); the ranks' state is lost")
KEPT = "(every rank returned to idle: the session keeps its state)"

# Every rank prints its pid, so a test can find it and see it is the same process.
PIDS = "%%ddp\nimport os\nprint('pid', os.getpid(), flush=True)"

BLOCKING = """\
%%ddp
import threading
print("waiting", flush=True)
threading.Event().wait()
"""


def failed(kernel: Kernel, code: str) -> CellResult:
    result = kernel.execute(code)
    assert result.status == "error", result.text()
    assert result.error is not None
    return result


def usage_error(kernel: Kernel, code: str) -> str:
    """The one line a cell failing with a ``UsageError`` shows (no traceback)."""
    result = kernel.execute(code)
    assert result.status == "error" and result.error is None, result.text()
    shown = result.stderr
    assert shown.startswith("UsageError: ") and shown.count("\n") == 1, shown
    return shown.rstrip("\n")


def traceback_of(result: CellResult) -> str:
    assert result.error is not None, result.text()
    return "\n".join(result.error["traceback"])


def per_rank(result: CellResult, word: str) -> dict[int, str]:
    """rank -> what it printed after ``word`` (one such line per rank)."""
    found = dict(re.findall(rf"^\[rank (\d)\] {word} (.+)$", result.rank_output, re.M))
    assert sorted(found) == ["0", "1"], result.text()
    return {int(rank): value for rank, value in found.items()}


def rank_pids(kernel: Kernel) -> dict[int, int]:
    """The session's rank -> pid, as ``%ddp_session`` shows them."""
    shown = ok(kernel, "%ddp_session").stdout
    rows = re.findall(r"^\s+(\d)\s+(\d+)\s", shown, re.M)
    assert len(rows) == 2, shown
    return {int(rank): int(pid) for rank, pid in rows}


def start_session(kernel: Kernel) -> dict[int, int]:
    ok(kernel, "%load_ext nbddp")  # a second load keeps the first
    started = ok(kernel, START).stdout
    assert "session: running; 2 ranks (cpu, gloo)" in started, started
    return rank_pids(kernel)


def interrupted(kernel: Kernel, code: str) -> tuple[CellResult, float]:
    """Run ``code``, interrupt the kernel once the cell has printed ``waiting``; the
    cell's result and the seconds from the interrupt to the cell's end."""
    msg_id = kernel.kc.execute(code)
    kernel.wait_for_output(msg_id, "waiting")
    interrupted_at = time.monotonic()
    kernel.interrupt()
    result = kernel.collect(msg_id, timeout=30)
    return result, time.monotonic() - interrupted_at


def ranks_and_keepers(pids: dict[int, int]) -> list[psutil.Process]:
    """The session's ranks and each rank's keeper (its parent, nbddp-keeper)."""
    procs = [psutil.Process(pid) for pid in pids.values()]
    keepers = [p.parent() for p in procs]
    assert all(k is not None and k.name() == "nbddp-keeper" for k in keepers), keepers
    return procs + [k for k in keepers if k is not None]


@pytest.fixture
def shared(notebook: Kernel) -> Iterator[Kernel]:
    """The shared kernel with a session on 2 CPU ranks, stopped after the test (a
    session's ranks outlive no test: the leftover check would take them for strays)."""
    pids = start_session(notebook)
    yield notebook
    assert rank_pids(notebook) == pids, "the session's ranks changed"
    ok(notebook, "%ddp_session stop")
    assert wait_gone(pids=set(pids.values())) == []


@pytest.fixture
def kernel() -> Iterator[Kernel]:
    """A kernel of the test's own (the test ends or disturbs its session)."""
    with Kernel() as k:
        yield k


# -- cells in one session (shared kernel) -----------------------------------------


BUILD = """\
%%ddp
import os
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

torch.manual_seed(rank)  # different on each rank: DDP broadcasts rank 0's weights
model = DDP(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
print("cell pid", os.getpid(), "group", id(dist.group.WORLD), flush=True)
"""

TRAIN = """\
%%ddp
g = torch.Generator().manual_seed(100 + rank)  # each rank its own data
for step in range(5):
    x = torch.randn(16, 4, generator=g)
    loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print("cell pid", os.getpid(), "group", id(dist.group.WORLD), flush=True)
print("loss", round(loss.item(), 4), flush=True)
"""

EVALUATE = """\
%%ddp
checksum = torch.tensor([float(sum(p.detach().double().sum() for p in model.parameters()))])
every = [torch.zeros(1) for _ in range(world_size)]
dist.all_gather(every, checksum)
assert every[0].item() == every[1].item(), every
print("cell pid", os.getpid(), "group", id(dist.group.WORLD), flush=True)
print("checksum", checksum.item(), flush=True)
[c.item() for c in every]
"""


def test_build_train_evaluate_in_three_cells_on_the_same_ranks(shared: Kernel) -> None:
    pids = rank_pids(shared)
    cells = [ok(shared, BUILD), ok(shared, TRAIN), ok(shared, EVALUATE)]
    # The same process and the same process group in every cell, on each rank.
    for rank in (0, 1):
        seen = {per_rank(cell, "cell pid")[rank] for cell in cells}
        assert len(seen) == 1, seen
        assert seen.pop().startswith(f"{pids[rank]} group ")
    # Training reached both ranks (each its own data), and the weights agree.
    losses = per_rank(cells[1], "loss")
    assert losses[0] != losses[1]
    checksums = per_rank(cells[2], "checksum")
    assert checksums[0] == checksums[1]
    assert cells[2].result == f"[{checksums[0]}, {checksums[0]}]"
    assert "model" in ok(shared, "%ddp_session").stdout


def test_a_rank_owned_name_is_never_overwritten_and_notebook_helpers_are_sent_each_time(
    shared: Kernel,
) -> None:
    ok(shared, "owned = 'notebook'\ndef helper(v):\n    return v + 1")
    ok(shared, "%%ddp\nowned = f'ranks {rank}'\nprint('owned', owned, helper(1))")
    ok(shared, "owned = 'notebook, again'")  # the notebook's own value changes
    first = ok(shared, "%%ddp\nprint('seen', owned, helper(1))")
    assert per_rank(first, "seen") == {0: "ranks 0 2", 1: "ranks 1 2"}

    ok(shared, "def helper(v):\n    return v + 100")  # edited in the notebook
    second = ok(shared, "%%ddp\nprint('seen', owned, helper(1))")
    assert per_rank(second, "seen") == {0: "ranks 0 101", 1: "ranks 1 101"}
    names = ok(shared, "%ddp_session").stdout
    shown = re.search(r"names on rank 0: (.+)", names)
    assert shown is not None and "owned" in shown.group(1).split(", ")
    assert "helper" not in shown.group(1).split(", ")
    assert ok(shared, "owned").result == "'notebook, again'"  # the notebook keeps its own


def test_a_failing_cell_keeps_the_session_state(shared: Kernel) -> None:
    ok(shared, "%%ddp\nkept = 10 * (rank + 1)")
    error = failed(shared, "%%ddp\nkept += 1\nraise ValueError(f'boom on rank {rank}')")
    assert error.error is not None and error.error["ename"] == "ValueError"
    text = traceback_of(error)
    assert "ValueError: boom on rank 0" in text
    assert text.rstrip().endswith(KEPT), text
    # Only rank 1 fails: rank 0 returns by itself, and both stay.
    one = failed(shared, "%%ddp\nif rank == 1:\n    raise KeyError('only rank 1')\nkept += 1")
    assert traceback_of(one).rstrip().endswith(KEPT)
    after = ok(shared, "%%ddp\nprint('kept', kept)")
    assert per_rank(after, "kept") == {0: "12", 1: "21"}


def test_timeout_interrupts_the_cell_and_keeps_the_state(shared: Kernel) -> None:
    ok(shared, "%%ddp\nbefore_timeout = rank + 7")
    started = time.monotonic()
    result = failed(shared, BLOCKING.replace("%%ddp", "%%ddp --timeout 1", 1))
    assert time.monotonic() - started < 15
    text = traceback_of(result)
    assert "timeout of 1s" in result.text()
    assert "the session keeps its state" in text, text
    after = ok(shared, "%%ddp\nprint('kept', before_timeout)")
    assert per_rank(after, "kept") == {0: "7", 1: "8"}


def test_a_cell_with_other_launch_options_is_a_one_line_usage_error(shared: Kernel) -> None:
    shown = usage_error(shared, "%%ddp --procs 3\nrank")
    assert "differ from the session's (--procs 2)" in shown
    # The session's own options, and an output setting of the cell's own, are fine.
    same = ok(shared, "%%ddp --procs 2 --output rank0\nprint('shown', rank)")
    assert "[rank 0] shown 0" in same.rank_output and "shown 1" not in same.text()


# -- each test disturbs its session: a kernel of its own ----------------------------


def test_kernel_interrupt_during_a_long_cell_keeps_the_state(kernel: Kernel) -> None:
    pids = start_session(kernel)
    ok(kernel, "%%ddp\nbefore = rank * 3")
    result, took = interrupted(kernel, BLOCKING)
    assert took < 10, f"{took:.1f}s from interrupt to the cell's end"
    assert result.status == "error" and result.error is not None
    assert result.error["ename"] == "KeyboardInterrupt"
    assert "the session keeps its state" in traceback_of(result)
    after = ok(kernel, "%%ddp\nprint('kept', before)")
    assert per_rank(after, "kept") == {0: "0", 1: "3"}
    assert rank_pids(kernel) == pids


STUCK = """\
%%ddp
import threading
import torch
import torch.distributed as dist
print("waiting", flush=True)
if rank == 0:
    dist.all_reduce(torch.ones(1))  # rank 1 never enters it
else:
    threading.Event().wait()
"""


REGROUPED = "the process group was closed to free it and re-initialised on every rank"

SUM = (
    "%%ddp\nimport torch, torch.distributed as dist\nt = torch.ones(1)\n"
    "dist.all_reduce(t)\nprint('sum', t.item(), 'state' in globals())"
)


def group_works_then_stop(kernel: Kernel, pids: dict[int, int], state_kept: bool) -> None:
    """Every rank joins an all_reduce (``SUM``) and has kept ``state`` or not; then the
    session stops and its ranks (``pids``) are gone."""
    line = f"2.0 {state_kept}"
    assert per_rank(ok(kernel, SUM), "sum") == {0: line, 1: line}
    ok(kernel, "%ddp_session stop")
    assert wait_gone(pids=set(pids.values())) == []


def test_an_interrupt_that_leaves_a_rank_in_a_collective_frees_it_and_keeps_the_state(
    kernel: Kernel,
) -> None:
    pids = start_session(kernel)
    ok(kernel, "%%ddp\nstate = 1")
    result, took = interrupted(kernel, STUCK)
    assert took < 10, f"{took:.1f}s from interrupt to the cell's end"
    assert result.error is not None and result.error["ename"] == "KeyboardInterrupt"
    text = traceback_of(result)
    assert REGROUPED in text and "DistributedDataParallel wrapper" in text, text
    assert rank_pids(kernel) == pids  # the same ranks, their state kept
    group_works_then_stop(kernel, pids, state_kept=True)


BLOCKED = """\
%%ddp
import torch
import torch.distributed as dist
if rank == 1:
    raise RuntimeError("rank 1 fails before the all_reduce")
dist.all_reduce(torch.ones(1))
"""


def test_a_rank_blocked_in_a_collective_is_freed_and_the_state_kept(kernel: Kernel) -> None:
    pids = start_session(kernel)
    ok(kernel, "%%ddp\nstate = 1")
    started = time.monotonic()
    result = failed(kernel, BLOCKED)
    took = time.monotonic() - started
    assert took < 15, f"{took:.1f}s for the blocked cell to end"
    text = traceback_of(result)
    assert "RuntimeError: rank 1 fails before the all_reduce" in text
    assert REGROUPED in text.splitlines()[-1], text
    assert rank_pids(kernel) == pids
    group_works_then_stop(kernel, pids, state_kept=True)


DDP_MODEL = """\
%%ddp
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
model = DDP(torch.nn.Linear(4, 2))
state = 1
"""


def test_a_rank_blocked_in_a_collective_is_freed_while_a_ddp_model_is_alive(
    kernel: Kernel,
) -> None:
    # The model holds the process group: destroying the group alone leaves its
    # connections open and the blocked rank waiting.
    pids = start_session(kernel)
    ok(kernel, DDP_MODEL)
    text = traceback_of(failed(kernel, BLOCKED))
    assert "RuntimeError: rank 1 fails before the all_reduce" in text
    assert REGROUPED in text.splitlines()[-1], text
    assert rank_pids(kernel) == pids
    group_works_then_stop(kernel, pids, state_kept=True)


STUCK_IN_C = """\
%%ddp
import signal, time
if rank == 1:
    raise RuntimeError("rank 1 fails while rank 0 is stuck")
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # no interrupt reaches it
time.sleep(3600)
"""


def test_a_rank_that_cannot_be_freed_ends_the_session(kernel: Kernel) -> None:
    pids = start_session(kernel)
    ok(kernel, "%%ddp\nstate = 1")
    started = time.monotonic()
    result = failed(kernel, STUCK_IN_C)
    took = time.monotonic() - started
    assert took < 15, f"{took:.1f}s for the stuck cell to end"
    text = traceback_of(result)
    assert "RuntimeError: rank 1 fails while rank 0 is stuck" in text
    ended = ENDED.search(text)
    assert ended is not None, text
    assert "rank(s) 0 did not return to idle" in ended.group(1)
    assert "%ddp_session restart" in text.splitlines()[-1]
    assert wait_gone(pids=set(pids.values())) == []

    assert ENDED.search(usage_error(kernel, "%%ddp\nprint(state)")) is not None

    restarted = ok(kernel, "%ddp_session restart").stdout
    assert "session: running" in restarted
    fresh = rank_pids(kernel)
    assert set(fresh.values()).isdisjoint(pids.values())
    group_works_then_stop(kernel, fresh, state_kept=False)


def test_a_rank_killed_during_a_cell_ends_the_session_naming_it(kernel: Kernel) -> None:
    pids = start_session(kernel)
    msg_id = kernel.kc.execute(BLOCKING)
    kernel.wait_for_output(msg_id, "waiting")
    os.kill(pids[1], signal.SIGKILL)
    result = kernel.collect(msg_id, timeout=30)
    assert result.status == "error", result.text()
    text = traceback_of(result)
    ended = ENDED.search(text)
    assert ended is not None, text
    assert ended.group(1) == "rank 1 was killed by signal SIGKILL (Killed)", text
    assert wait_gone(pids=set(pids.values())) == []
    shown = ok(kernel, "%ddp_session").stdout
    assert "session: ended (rank 1 was killed by signal SIGKILL" in shown, shown


def test_a_rank_killed_between_cells_ends_the_session_naming_it(kernel: Kernel) -> None:
    pids = start_session(kernel)
    rank = psutil.Process(pids[0])
    os.kill(pids[0], signal.SIGKILL)
    assert wait_procs_gone([rank], timeout=5.0) == []
    assert wait_gone(pids=set(pids.values())) == []
    shown = usage_error(kernel, "%%ddp\nrank")
    ended = ENDED.search(shown)
    assert ended is not None, shown
    assert ended.group(1) == "rank 0 was killed by signal SIGKILL (Killed)"


SAYS_WHEN_STOPPED = """\
%%ddp
import os
import signal


def stopping(signum, frame):  # says it was asked to stop, and does not (SIGKILL follows)
    with open(fifo, "w") as f:
        f.write("stopping")


if rank == 1:
    signal.signal(signal.SIGTERM, stopping)
"""


def test_a_cell_sent_while_the_session_is_ending_says_why_it_ended(
    kernel: Kernel, tmp_path: Path
) -> None:
    # The session stops its ranks after rank 0 dies; rank 1 outlives the stop by
    # ignoring SIGTERM, and says when it got it: the next cell lands while the
    # session is ending, and must name the rank and signal that ended it.
    pids = start_session(kernel)
    fifo = tmp_path / "stopping"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        ok(kernel, f"fifo = {str(fifo)!r}")
        ok(kernel, SAYS_WHEN_STOPPED)
        os.kill(pids[0], signal.SIGKILL)
        assert select.select([reader], [], [], 30)[0], "rank 1 was never asked to stop"
        shown = usage_error(kernel, "%%ddp\nrank")
    finally:
        os.close(reader)
    ended = ENDED.search(shown)
    assert ended is not None, shown
    assert ended.group(1) == "rank 0 was killed by signal SIGKILL (Killed)"
    assert wait_gone(pids=set(pids.values())) == []


def test_stop_and_restart(kernel: Kernel) -> None:
    pids = start_session(kernel)
    ok(kernel, "%%ddp\nold = rank")
    restarted = ok(kernel, "%ddp_session restart").stdout
    assert "session: running" in restarted and "0 cells run" in restarted
    fresh = rank_pids(kernel)
    assert set(fresh.values()).isdisjoint(pids.values())
    assert wait_gone(pids=set(pids.values())) == []
    result = ok(kernel, "%%ddp\nimport os\nprint('old', 'old' in globals(), os.getpid())")
    assert per_rank(result, "old") == {r: f"False {fresh[r]}" for r in (0, 1)}

    assert "stopped" in ok(kernel, "%ddp_session stop").stdout
    assert wait_gone(pids=set(fresh.values())) == []
    assert ours(pids=kernel.descendants()) == []
    assert "no session" in ok(kernel, "%ddp_session").stdout
    for verb in ("stop", "restart"):
        for line in (f"%ddp_session {verb}", f"%ddp_session {verb}   # a comment is left out"):
            assert usage_error(kernel, line) == (
                f"UsageError: %ddp_session {verb}: no session is running; %ddp_session start "
                "[options] starts one"
            )
    # One-shot cells again: fresh ranks each time.
    assert ok(kernel, "%%ddp --procs 2\nrank + 1").result == "1"


def test_reloading_the_extension_stops_the_session(kernel: Kernel) -> None:
    # The reloaded magics start afresh: the old session's ranks must not live on
    # with nothing left in the notebook that can reach them.
    pids = start_session(kernel)
    ok(kernel, "%reload_ext nbddp")
    assert wait_gone(pids=set(pids.values()), timeout=5.0) == []
    assert "no session" in ok(kernel, "%ddp_session").stdout
    assert ok(kernel, "%%ddp --procs 2\nrank + 1").result == "1"


# -- the kernel goes away with a session running --------------------------------------


CHILD = """\
%%ddp
import subprocess
child = subprocess.Popen(["sleep", "600"])
print("child", child.pid, flush=True)
"""


def session_tree(kernel: Kernel) -> list[psutil.Process]:
    """Start a session whose ranks each started a child; the ranks, keepers and children."""
    pids = start_session(kernel)
    children = per_rank(ok(kernel, CHILD), "child")
    tree = ranks_and_keepers(pids) + [psutil.Process(int(pid)) for pid in children.values()]
    assert len(tree) == 6
    return tree


def test_kernel_restart_with_a_session_leaves_nothing(kernel: Kernel) -> None:
    tree = session_tree(kernel)
    started = kernel.descendants()
    kernel.km.restart_kernel(now=True)
    assert wait_procs_gone(tree, timeout=5.0) == []
    assert wait_gone(roles=("worker", "forkserver", "idle"), pids=started) == []


def test_kernel_killed_with_a_session_leaves_nothing(kernel: Kernel) -> None:
    tree = session_tree(kernel)
    started = kernel.descendants()
    kernel.kill()
    assert wait_procs_gone(tree, timeout=5.0) == []
    assert wait_gone(roles=("worker", "forkserver", "idle"), pids=started) == []
