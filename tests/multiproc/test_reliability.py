"""Faults end cleanly and quickly, repetition leaks nothing, and nobody else gets in.

Each test also gets the leftover-process check (tests/conftest.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

import nbddp
from nbddp.launcher.forkserver_link import FORKSERVER
from tests.displays import QuietDisplay
from tests.multiproc import fns
from tests.procs import threads_and_fds, wait_pool


def test_a_rank_returning_early_ends_the_run_with_the_waiting_ranks_error() -> None:
    # gloo notices the peer is gone at once: no 30-minute collective timeout.
    run = nbddp.launch(fns.return_early_on, 0, procs=2, block=False, output="none")
    with pytest.raises(RuntimeError) as info:
        run.wait()
    assert any("raised on rank 1" in note for note in info.value.__notes__)
    assert run.rank_states()[0] == "done"


def test_every_byte_written_before_a_sigkill_is_in_the_log() -> None:
    nbytes = 4 << 20  # far more than a pipe buffer holds
    run = nbddp.launch(fns.write_then_sigkill, nbytes, procs=2, block=False, output="none")
    with pytest.raises(nbddp.RankExitedError, match="SIGKILL"):
        run.wait()
    for rank in (0, 1):
        log = run.output(rank)
        lines = [ln for ln in log.splitlines() if ln.startswith("line ")]
        assert lines == [f"line {i:08d}" for i in range(len(lines))]
        assert sum(len(ln) + 1 for ln in lines) >= nbytes
        assert "last words on fd 2" in log


def _listening(pid: int) -> set[tuple[str, int]]:
    return {
        (c.laddr.ip, c.laddr.port)
        for c in psutil.Process(pid).net_connections("inet")
        if c.status == psutil.CONN_LISTEN
    }


def test_rendezvous_store_and_gloo_listen_on_loopback_only() -> None:
    listening = nbddp.launch(fns.listening_sockets, procs=2, output="none")
    assert listening, "rank 0 should at least listen for gloo"
    assert all(ip == "127.0.0.1" for ip, _ in listening), listening


def test_nothing_can_connect_to_the_channel_and_the_run_is_unaffected(tmp_path: Path) -> None:
    fifo = tmp_path / "go"
    for rank in (0, 1):
        os.mkfifo(f"{fifo}.{rank}")
    before = _listening(os.getpid())
    run = nbddp.launch(fns.wait_on_fifo, str(fifo), procs=2, block=False, output="none")
    # While the ranks run, the notebook has no listener beyond the rendezvous store,
    # which is torch's (loopback only), not the channel.
    new = _listening(os.getpid()) - before
    assert all(ip == "127.0.0.1" for ip, _ in new)
    # An intruder (another local process) tries to open each of the notebook's sockets
    # through /proc, which is the only handle an unnamed socketpair has: refused.
    intruder = textwrap.dedent(
        f"""
        import errno, os
        results = []
        for name in os.listdir("/proc/{os.getpid()}/fd"):
            path = f"/proc/{os.getpid()}/fd/{{name}}"
            try:
                target = os.readlink(path)
            except OSError:
                continue
            if not target.startswith("socket:"):
                continue
            try:
                os.close(os.open(path, os.O_RDWR))
                results.append("opened")
            except OSError as exc:
                results.append(errno.errorcode[exc.errno])
        print(sorted(set(results)))
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", intruder], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert "opened" not in proc.stdout
    assert "ENXIO" in proc.stdout
    for rank in (0, 1):
        with open(f"{fifo}.{rank}", "w") as f:
            f.write("go\n")
    assert run.wait().values == {0: "go", 1: "go"}


def _resources() -> tuple[int, int, int, int]:
    me = psutil.Process()
    return (*threads_and_fds(), len(me.children(recursive=True)), len(_listening(me.pid)))


def test_fifty_launches_leak_no_threads_fds_processes_or_ports() -> None:
    nbddp.launch(fns.all_reduce_sum, 0.0, procs=2, output="none")  # warm: loop thread, forkserver
    forkserver = FORKSERVER.pid
    assert forkserver is not None
    wait_pool(forkserver, 2)  # the forkserver refills its pool after a run: count once it has
    threads, fds, procs, ports = _resources()
    for _ in range(50):
        assert nbddp.launch(fns.all_reduce_sum, 0.0, procs=2, output="none") == 1.0
    wait_pool(forkserver, 2)  # still two idle workers: each run's are gone, none piled up
    threads_after, fds_after, procs_after, ports_after = _resources()
    # A leak would grow by one or more per launch (50+). The last run's rendezvous
    # store closes its socket on torch's own thread, so either snapshot may still
    # hold that one fd (and that thread): a difference of one is the same state.
    assert abs(fds_after - fds) <= 1 and abs(threads_after - threads) <= 1
    assert (procs_after, ports_after) == (procs, ports)


def test_stacks_can_be_dumped_from_a_running_job(tmp_path: Path) -> None:
    fifo = tmp_path / "go"
    for rank in (0, 1):
        os.mkfifo(f"{fifo}.{rank}")
    text = {0: "", 1: ""}
    run = nbddp.launch(fns.wait_on_fifo, str(fifo), procs=2, block=False, output="none", timeout=60)

    class DumpWhenReady(QuietDisplay):
        dumped = False
        released = False

        def output(self, rank: int, stream: str, chunk: str) -> None:
            text[rank] += chunk
            if not self.dumped and all("ready" in t for t in text.values()):
                self.dumped = True
                run.dump_stacks()
            if not self.released and all("in wait_on_fifo" in t for t in text.values()):
                self.released = True
                # Never blocking the display's thread on a rank: a FIFO opened read-write
                # opens at once, and held open, its line waits for the rank to read it.
                for r in (0, 1):
                    held.append(os.open(f"{fifo}.{r}", os.O_RDWR))
                    os.write(held[-1], b"go\n")

    held: list[int] = []
    run.display = DumpWhenReady()
    try:
        assert run.wait().values == {0: "go", 1: "go"}
    finally:
        for fd in held:
            os.close(fd)
    assert all("in wait_on_fifo" in run.output(r) for r in (0, 1))
