"""Nothing a rank starts outlives it, whatever it does with sessions and whichever
start method started it (every rank runs under a keeper); ranks outlive
their forkserver and still report how they ended; an interrupt while the first
launch waits for the forkserver leaves no process and no fd behind.

Each test also gets the leftover-process check (tests/conftest.py).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

import nbddp
from nbddp.launcher import starters
from nbddp.launcher.forkserver_link import FORKSERVER
from tests.multiproc import escape_fns
from tests.procs import threads_and_fds, wait_procs_gone

REPO = Path(__file__).resolve().parents[2]
METHODS = ("forkserver", "spawn", "fork")


def _resources() -> tuple[int, int, int]:
    # A spawned or forked rank's keeper is the notebook's child, reaped by a
    # thread that ends just after the keeper reported the rank's exit code.
    for thread in threading.enumerate():
        if thread.name == "nbddp-reap":
            thread.join(timeout=5)
    return (*threads_and_fds(), len(psutil.Process().children(recursive=True)))


def _gone(pids: list[int], timeout: float = 5.0) -> list[int]:
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    survivors = wait_procs_gone(procs, timeout)
    for proc in survivors:
        proc.kill()
    return [p.pid for p in survivors]


def _warm(method: str = "forkserver") -> None:
    """The relay loop and the forkserver's pool exist before resources are counted."""
    assert nbddp.launch(escape_fns.noop, procs=2, output="none", start_method=method) == 0


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(
    "fn", [escape_fns.setsid_child_holding_pipes, escape_fns.double_fork_with_pipes_closed]
)
def test_a_process_that_left_the_ranks_session_ends_with_the_rank(fn: object, method: str) -> None:
    _warm(method)
    before = _resources()
    run = nbddp.launch(fn, procs=2, block=False, output="none", start_method=method)  # type: ignore[call-overload]
    result = run.wait()
    escaped = list(result.values.values())
    assert len(escaped) == 2
    # Gone when the launch returns (a zombie nobody reaped counts as gone).
    assert _gone(escaped, timeout=0.5) == []
    threads, fds, _ = _resources()
    named = [t.name for t in threading.enumerate()], psutil.Process().open_files()
    assert (threads, fds) == before[:2], (before, threads, fds, named)


@pytest.mark.parametrize("method", METHODS)
def test_killing_the_notebook_takes_down_what_ranks_started_in_other_sessions(
    tmp_path: Path, method: str
) -> None:
    script = tmp_path / "escape.py"
    script.write_text(
        "import nbddp\nfrom tests.multiproc import escape_fns\n"
        f"nbddp.launch(escape_fns.escape_then_hang, procs=2, start_method={method!r})\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, text=True, cwd=REPO, env=env
    )
    assert proc.stdout is not None
    escaped: list[int] = []
    try:
        for line in proc.stdout:  # the script relays "[rank N] escaped PID" lines
            found = re.search(r"escaped (\d+)", line)
            if found:
                escaped.append(int(found.group(1)))
            if len(escaped) == 2:
                break
        tree = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    assert len(escaped) == 2
    assert _gone([*escaped, *tree]) == []


def _fifos(tmp_path: Path) -> Path:
    fifo = tmp_path / "go"
    for rank in (0, 1):
        os.mkfifo(f"{fifo}.{rank}")
    return fifo


def _release(fifo: Path) -> None:
    for rank in (0, 1):
        with open(f"{fifo}.{rank}", "w") as f:
            f.write("go\n")


def _kill_forkserver_when_ready(run: nbddp.Run, fifo: Path) -> None:
    """Once both ranks said they are ready (read from their logs: they may have said it
    before this was called), SIGKILL the forkserver, then let the ranks go on."""
    deadline = time.monotonic() + 60
    while not all("ready" in run.output(rank) for rank in (0, 1)):
        assert time.monotonic() < deadline, [run.output(rank) for rank in (0, 1)]
        time.sleep(0.05)
    pid = FORKSERVER.pid
    assert pid is not None
    server = psutil.Process(pid)
    os.kill(pid, signal.SIGKILL)
    server.wait(5)
    _release(fifo)


@pytest.mark.parametrize(("code", "values"), [(0, {0: "go", 1: "go"}), (3, None)])
def test_ranks_outlive_a_killed_forkserver_and_report_how_they_ended(
    tmp_path: Path, code: int, values: dict[int, str] | None
) -> None:
    _warm()
    fifo = _fifos(tmp_path)
    run = nbddp.launch(
        escape_fns.wait_then_exit, str(fifo), code, procs=2, block=False, output="none"
    )
    _kill_forkserver_when_ready(run, fifo)
    if values is not None:
        assert run.wait().values == values
    else:
        with pytest.raises(nbddp.RankExitedError) as info:
            run.wait()
        assert info.value.rank == 1 and info.value.exit_code == code
    assert nbddp.launch(escape_fns.noop, procs=2, output="none") == 0  # on a new forkserver


INTERRUPT_DURING_START = textwrap.dedent(
    """
    import signal, threading
    import torch.distributed  # as a notebook that used torch has: the launch is at once
    import nbddp
    from tests.multiproc import escape_fns
    from tests.procs import fd_targets

    # What the first launch of a process creates once (the relay's thread and fds,
    # torch's) exists before counting; spawn leaves the forkserver unstarted.
    assert nbddp.launch(escape_fns.noop, procs=1, output="none", start_method="spawn") == 0

    def held():
        # A launch returns once its ranks have; their keepers' reapers end just after.
        for thread in threading.enumerate():
            if thread.name == "nbddp-reap":
                thread.join()
        return sorted(t.name for t in threading.enumerate()), fd_targets()

    before = held()
    main = threading.main_thread().ident
    threading.Timer(0.5, signal.pthread_kill, (main, signal.SIGINT)).start()
    try:
        nbddp.launch(escape_fns.setsid_child_holding_pipes, procs=2, output="none")
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    # The forkserver serves the abandoned request before this launch's: the rank
    # it starts for it must find its link closed and end.
    assert nbddp.launch(escape_fns.noop, procs=2, output="none") == 0
    nbddp.shutdown()
    after = held()
    print("before", before, "after", after, flush=True)
    assert after == before, (before, after)
    """
)


def test_an_interrupt_while_the_forkserver_starts_leaks_no_process_or_fd(tmp_path: Path) -> None:
    script = tmp_path / "interrupt.py"
    script.write_text(INTERRUPT_DURING_START)
    env = dict(os.environ, PYTHONPATH=str(REPO), NBDDP_PREWARM="0")
    proc = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=120,
    )
    assert "interrupted" in proc.stdout, proc.stderr
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_spawned_keeper_that_fails_before_its_rank_raises_and_leaks_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _warm("spawn")
    before = _resources()
    monkeypatch.setattr(starters, "SPAWN_BOOT", "raise SystemExit(3)")
    with pytest.raises(RuntimeError, match=r"could not spawn a worker.*start_method='forkserver'"):
        nbddp.launch(escape_fns.noop, procs=2, output="none", start_method="spawn")
    assert _resources() == before
