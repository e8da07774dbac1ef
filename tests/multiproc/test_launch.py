"""launch / notebook_launcher / spawn on 2 gloo CPU ranks: results, output, errors, cleanup.

Every test here gets the leftover-process check (tests/conftest.py).
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import stat
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

import nbddp
from nbddp.entry import start_run
from nbddp.errors import PayloadError, RemoteTraceback
from nbddp.launcher.config import LaunchConfig
from nbddp.launcher.job import Job
from tests.displays import QuietDisplay
from tests.multiproc import fns
from tests.procs import alive as _alive
from tests.procs import ours

METHODS = ["forkserver", "spawn", "fork"]


@pytest.mark.parametrize("method", METHODS)
def test_launch_returns_rank0_value_and_relays_each_rank(method: str, capsys: Any) -> None:
    value = nbddp.launch(fns.all_reduce_sum, 0.5, procs=2, start_method=method)
    assert value == 2.0  # (0 + 0.5) + (1 + 0.5)
    out = capsys.readouterr().out.splitlines()
    assert "[rank 0] rank 0 of 2: sum 2.0" in out
    assert "[rank 1] rank 1 of 2: sum 2.0" in out


def test_block_false_gives_a_run_with_every_ranks_value() -> None:
    run = nbddp.launch(fns.all_reduce_sum, 1.0, procs=2, block=False, output="none")
    result = run.wait()
    assert result.values == {0: 3.0, 1: 3.0}
    assert result.exit_codes == {0: 0, 1: 0}
    assert run.status == "done"
    assert run.rank_states() == {0: "done", 1: "done"}
    assert "sum 3.0" in run.output(1)


def test_ranks_get_the_torch_distributed_environment(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)  # the ranks start in the notebook's working directory
    # As torchrun: the notebook's own setting, else the cores shared among the ranks.
    threads = os.environ.get("OMP_NUM_THREADS") or str(max(1, (os.cpu_count() or 1) // 2))
    run = nbddp.launch(
        fns.environment, procs=2, env={"EXTRA": "x"}, port=None, block=False, mixed_precision="bf16"
    )
    values = run.wait().values
    port = values[0]["env"]["MASTER_PORT"]
    for rank in (0, 1):
        env = values[rank]["env"]
        assert env["RANK"] == env["LOCAL_RANK"] == str(rank)
        assert env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == "2"
        assert (env["GROUP_RANK"], env["NODE_RANK"], env["MASTER_ADDR"]) == ("0", "0", "127.0.0.1")
        assert env["MASTER_PORT"] == port and port.isdigit()
        assert env["CUDA_VISIBLE_DEVICES"] == ""
        assert env["ACCELERATE_MIXED_PRECISION"] == "bf16"
        assert env["EXTRA"] == "x"
        assert env["OMP_NUM_THREADS"] == threads
        assert values[rank]["threads"] == int(threads)  # applied to torch, imported earlier
        assert values[rank]["cuda_initialized"] is False
        assert values[rank]["cwd"] == str(tmp_path)
        assert values[rank]["pgid_is_pid"]  # own process group: stop reaches its children


def test_fd_level_output_reaches_the_cell_and_the_log(capsys: Any) -> None:
    run = nbddp.launch(fns.talk, procs=2, block=False)
    run.wait()
    captured = capsys.readouterr()
    for rank in (0, 1):
        for line in (f"py-stdout {rank}", f"fd1 {rank}", f"c-puts {rank}"):
            assert f"[rank {rank}] {line}" in captured.out.splitlines()
        for line in (f"py-stderr {rank}", f"fd2 {rank}"):
            assert f"[rank {rank}] {line}" in captured.err.splitlines()
        log = run.output(rank)
        assert all(w in log for w in ("py-stdout", "py-stderr", "fd1", "fd2", "c-puts"))
    assert stat.S_IMODE(run.log_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((run.log_dir / "rank0.log").stat().st_mode) == 0o600


def test_output_arrives_while_the_run_goes_on(tmp_path: Path) -> None:
    fifo = tmp_path / "go"
    for rank in (0, 1):
        os.mkfifo(f"{fifo}.{rank}")
    seen: list[str] = []

    class Watch(QuietDisplay):
        def output(self, rank: int, stream: str, text: str) -> None:
            seen.append(text)
            if sum("ready" in t for t in seen) == 2:
                # Both ranks are still blocked on the FIFO, yet their output is here.
                for rank in (0, 1):
                    with open(f"{fifo}.{rank}", "w") as f:
                        f.write("go\n")

    run = nbddp.launch(fns.wait_on_fifo, str(fifo), procs=2, block=False)
    run.display = Watch()
    assert run.wait().values == {0: "go", 1: "go"}


def test_rank_exception_is_raised_with_its_type_and_traceback_and_others_stop() -> None:
    with pytest.raises(fns.CustomError, match="boom on rank 1") as info:
        nbddp.launch(fns.fail_on, 1, "raise", procs=2, output="none")
    exc = info.value
    assert isinstance(exc.__cause__, RemoteTraceback)
    assert 'raise CustomError(f"boom on rank {rank}")' in str(exc.__cause__)
    assert "rank 1" in str(exc.__cause__)
    assert any("raised on rank 1" in note for note in exc.__notes__)


def test_exception_that_cannot_be_rebuilt_becomes_remote_error() -> None:
    with pytest.raises(nbddp.RemoteError) as info:
        nbddp.launch(fns.fail_on, 0, "unpicklable", procs=2, output="none")
    assert info.value.rank == 0
    assert info.value.remote_type == "tests.multiproc.fns.Unpicklable"
    assert "holds a lock" in str(info.value)
    assert "Unpicklable" in info.value.remote_traceback


@pytest.mark.parametrize(
    ("how", "needle", "code"),
    [
        ("sys.exit", "rank 1 ended with exit code 3", 3),
        ("os._exit", "rank 1 ended with exit code 9", 9),
        ("segfault", "rank 1 was killed by signal SIGSEGV", -11),
        ("sigkill", "rank 1 was killed by signal SIGKILL", -9),
    ],
)
def test_a_rank_that_dies_is_named_with_its_exit_code_or_signal(
    how: str, needle: str, code: int
) -> None:
    run = nbddp.launch(fns.fail_on, 1, how, procs=2, output="none", block=False)
    with pytest.raises(nbddp.RankExitedError, match=needle) as info:
        run.wait()
    assert info.value.exit_code == code
    assert info.value.rank == 1
    assert f"rank 1 about to {how}" in run.output(1)  # written just before dying: kept
    assert nbddp.launch(fns.all_reduce_sum, 0.0, procs=2, output="none") == 1.0  # next works
    if how == "segfault":
        assert "Fatal Python error: Segmentation fault" in run.output(1)


def test_keyboard_interrupt_stops_every_rank_and_reraises() -> None:
    class InterruptWhenHanging(QuietDisplay):
        def output(self, rank: int, stream: str, text: str) -> None:
            if "hanging" in text:
                raise KeyboardInterrupt  # as Ctrl-C / kernel interrupt would, in wait()

    run = nbddp.launch(fns.hang, procs=2, block=False)
    run.display = InterruptWhenHanging()
    with pytest.raises(KeyboardInterrupt):
        run.wait()
    assert run.status == "interrupted"
    assert run.rank_states() == {0: "stopped", 1: "stopped"}
    assert all(o.exit_code is not None and o.exit_code < 0 for o in run.outcomes())


def test_dataloader_worker_processes_are_stopped_with_their_rank() -> None:
    # Rank 1 raises; rank 0 blocks with its workers running, and is stopped.
    run = nbddp.launch(fns.dataloader_then_fail, procs=2, output="none", block=False)
    with pytest.raises(RuntimeError, match="failed while DataLoader workers run"):
        run.wait(timeout=30)
    workers = []
    for rank in (0, 1):
        said = re.search(r"ready \d workers \[([\d, ]+)\]", run.output(rank))
        assert said is not None, run.output(rank)
        workers += [int(pid) for pid in said.group(1).split(",")]
    assert len(workers) == 4  # two per rank, running when each said so
    # Every one is gone once the run has ended: none is left to the leftover check.
    assert [pid for pid in workers if psutil.pid_exists(pid) and _alive(pid)] == []


def test_timeout_dumps_every_ranks_stacks_then_stops() -> None:
    run = nbddp.launch(fns.hang, procs=2, timeout=2, block=False, output="none")
    with pytest.raises(nbddp.LaunchTimeout, match=r"timeout of 2s .* ranks 0, 1 still running"):
        run.wait()
    for rank in (0, 1):
        log = run.output(rank)
        assert f"nbddp: rank {rank} (pid " in log and "Thread 'MainThread':" in log
        assert "in hang" in log  # the stack shows where the rank was stuck


def test_unpicklable_function_fails_before_any_process_starts() -> None:
    import threading

    lock = threading.Lock()
    with pytest.raises(nbddp.PayloadError, match=r"closure 'lock' \(_thread.lock\)"):
        nbddp.launch(lambda: lock.locked(), procs=2)


def test_notebook_launcher_forms_one_group_that_accelerate_sees() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        value = nbddp.notebook_launcher(
            fns.accelerate_view, num_processes=2, mixed_precision="bf16", use_port=str(port)
        )
    assert value["num_processes"] == 2
    assert value["process_index"] == 0
    assert value["mixed_precision"] == "bf16"
    assert value["reduced"] == 2.0
    assert "MULTI_CPU" in value["distributed_type"]


def test_notebook_launcher_says_which_port_it_took_instead(capsys: Any) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        nbddp.notebook_launcher(fns.all_reduce_sum, args=(0.0,), num_processes=2, use_port=port)
    assert f"port {port} on 127.0.0.1 is in use; using port" in capsys.readouterr().err


def test_notebook_launcher_rejects_multi_node_options_clearly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Without a cluster configured (NBDDP_CLUSTER) there is nowhere to run the other nodes.
    monkeypatch.delenv("NBDDP_CLUSTER", raising=False)
    with pytest.raises(nbddp.ConfigError, match=r"^num_nodes=2 needs a cluster: set NBDDP_"):
        nbddp.notebook_launcher(fns.all_reduce_sum, args=(0.0,), num_processes=2, num_nodes=2)


def test_spawn_calls_fn_with_rank_first(tmp_path: Path) -> None:
    assert nbddp.spawn(fns.spawn_style, args=(2, str(tmp_path)), nprocs=2) is None
    assert sorted(p.read_text() for p in tmp_path.iterdir()) == ["0/2", "1/2"]
    run = nbddp.spawn(fns.spawn_style, args=(2, str(tmp_path)), nprocs=2, join=False)
    assert run is not None and run.join() is True


def test_stop_ends_a_running_job() -> None:
    config = LaunchConfig.build(procs=2, output="none")
    run = start_run(config, fns.hang, (), {})
    run.stop()
    with pytest.raises(nbddp.RankError, match="the run was stopped"):
        run.wait()
    assert run.status == "stopped"


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_a_rank_that_returned_stays_until_every_rank_has(tmp_path: Path, method: str) -> None:
    # Exiting would close its gloo connections under a peer still using them
    # ("connectFullMesh failed ... closed by peer" on a loaded machine).
    import psutil

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    run = nbddp.launch(
        fns.init_then_return, str(fifo), procs=2, start_method=method, output="none", block=False
    )
    assert isinstance(run, nbddp.Run)
    try:
        deadline = time.monotonic() + 60
        while run.outcomes()[0].value is None:  # rank 0 has returned its value
            assert time.monotonic() < deadline and not run.ended()
            run.ended(0.02)
        rank0 = psutil.Process(run.pids[0])
        assert rank0.status() != psutil.STATUS_ZOMBIE and not run.outcomes()[0].exited
    finally:
        # Release rank 1 however the checks went (non-blocking: it may be gone).
        with contextlib.suppress(OSError):
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            os.write(fd, b"go\n")
            os.close(fd)
    result = run.wait()
    assert result.values == {0: 0, 1: 1}
    assert result.exit_codes == {0: 0, 1: 0}


def test_a_keyword_meant_as_a_launch_option_starts_no_process(monkeypatch: Any) -> None:
    starts: list[Job] = []
    real_start = Job.start

    def counted(job: Job) -> None:
        starts.append(job)
        real_start(job)

    monkeypatch.setattr(Job, "start", counted)
    before = {p.pid for p in ours(("worker",))}
    with pytest.raises(PayloadError) as info:
        nbddp.launch(fns.all_reduce_sum, 0.5, nprocs=2)
    assert str(info.value) == (
        "all_reduce_sum() got an unexpected keyword argument 'nprocs'; "
        "did you mean the launch option procs=2?"
    )
    assert not starts
    assert {p.pid for p in ours(("worker",))} <= before  # no rank was started
    # The same call with the option spelt right runs (the count above can see a start).
    assert nbddp.launch(fns.all_reduce_sum, 0.5, procs=2, output="none") == 2.0
    assert len(starts) == 1
