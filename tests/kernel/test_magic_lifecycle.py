"""``%%ddp`` across a kernel's life: interrupt, shutdown, and the kernel being killed.

Each test has its own kernel, since each ends or disturbs it.
"""

from __future__ import annotations

import time

from tests.kernel.kernel import Kernel
from tests.procs import ours, wait_gone, wait_pool

BLOCKING_CELL = """\
%%ddp --procs 2
import threading
print("ready", flush=True)
threading.Event().wait()
"""

# Each rank runs under its keeper (nbddp/forkserver/keeper.py), which goes with it.
RANKS_AND_KEEPERS = ["nbddp-keeper", "nbddp-keeper", "nbddp-rank0", "nbddp-rank1"]


def test_interrupt_stops_every_rank_and_the_next_cell_runs() -> None:
    with Kernel() as kernel:
        assert kernel.execute("%load_ext nbddp").status == "ok"
        msg_id = kernel.kc.execute(BLOCKING_CELL)
        kernel.wait_for_output(msg_id, "ready")
        ranks = ours(pids=kernel.descendants())
        assert sorted(p.name() for p in ranks) == RANKS_AND_KEEPERS

        interrupted_at = time.monotonic()
        kernel.interrupt()
        result = kernel.collect(msg_id, timeout=30)
        assert time.monotonic() - interrupted_at < 10
        assert result.status == "error"
        assert result.error is not None and result.error["ename"] == "KeyboardInterrupt"
        assert "every rank was stopped" in "\n".join(result.error["traceback"])
        assert wait_gone(pids={p.pid for p in ranks}) == []
        status = kernel.execute("%ddp_status").stdout
        assert status.startswith("latest run: interrupted")
        assert "rank 1: stopped" in status

        after = kernel.execute("%%ddp --procs 2\nprint('again', rank)\nrank + 1")
        assert after.status == "ok", after.text()
        assert "[rank 1] again 1" in after.rank_output and after.result == "1"


def test_no_worker_or_forkserver_left_after_kernel_shutdown() -> None:
    with Kernel() as kernel:
        assert kernel.execute("%load_ext nbddp").status == "ok"
        assert kernel.execute("%%ddp --procs 2\nrank").status == "ok"
        (forkserver,) = ours(roles=("forkserver",), pids=kernel.descendants())  # its forkserver
        assert len(wait_pool(forkserver.pid, 2)) == 2  # refilled after the run: idle workers
        started = kernel.descendants()
    assert wait_gone(roles=("worker", "forkserver", "idle"), pids=started) == []


def test_no_worker_or_forkserver_left_when_the_kernel_is_killed() -> None:
    with Kernel() as kernel:
        assert kernel.execute("%load_ext nbddp").status == "ok"
        msg_id = kernel.kc.execute(BLOCKING_CELL)
        kernel.wait_for_output(msg_id, "ready")
        started = kernel.descendants()
        assert sorted(p.name() for p in ours(pids=started)) == RANKS_AND_KEEPERS
        kernel.kill()
        assert wait_gone(roles=("worker", "forkserver", "idle"), pids=started) == []
