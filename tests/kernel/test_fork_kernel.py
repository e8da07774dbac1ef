"""The kernel can be forked after nbddp's cells, as accelerate's notebook_launcher and a
DataLoader's workers fork it: whatever nbddp keeps there (its relay thread, the forkserver's
link, a session) leaves nothing that a child could wait on forever."""

from __future__ import annotations

from tests.kernel.kernel import Kernel, ok

FORKS = 50

FORK_MANY = f"""
import gc, logging, multiprocessing, os, select, signal, torch
hung = []
for i in range({FORKS}):
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            print("child", i, flush=True)
            logging.getLogger("child").warning("child %d", i)
            torch.ones(2).sum().item()
            multiprocessing.current_process().name
            gc.collect()  # what nbddp left in the kernel is collected here too
            os.write(done_w, b"k")
        finally:
            os._exit(0)
    os.close(done_w)
    ready, _, _ = select.select([done_r], [], [], 20)
    os.close(done_r)
    if not ready:
        hung.append(pid)
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
print("hung:", hung)
"""


def test_the_kernel_forks_after_ddp_cells_and_a_session(kernel: Kernel) -> None:
    ok(kernel, "%load_ext nbddp")
    for n in range(3):
        ok(kernel, f"%%ddp --procs 2\nprint('cell {n} on', rank)\n")
    ok(kernel, "%ddp_session start --procs 2")
    ok(kernel, "%%ddp\nkept = rank\n")
    forked = ok(kernel, FORK_MANY)  # while the session's ranks are up
    assert "hung: []" in forked.stdout, forked.text()
    ok(kernel, "%ddp_session stop")
    forked = ok(kernel, FORK_MANY)
    assert "hung: []" in forked.stdout, forked.text()
