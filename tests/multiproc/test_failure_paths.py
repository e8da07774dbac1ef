"""Failure paths lose nothing and become the right error: the launch environment,
rows and results from a rank's forked children, exceptions that resist being described,
a notebook function's error shown with its cell's lines and what became of the others.

Each test also gets the leftover-process check (tests/conftest.py); those that fail
a launch check that it leaks no fd, thread or process in the notebook.
"""

from __future__ import annotations

import contextlib
import linecache
import os
import re
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

import nbddp
from nbddp.errors import ConfigError, RemoteError
from nbddp.launcher.forkserver_link import FORKSERVER
from tests.multiproc import failing, fns
from tests.procs import threads_and_fds, wait_gone, wait_procs_gone
from tests.sources import FAILING_TRAIN

BIG = 200 * 1024  # bytes: more than one variable given to a new process may hold (128 KiB)


def _resources() -> tuple[int, int, int]:
    """Threads, fds, and the rank-side processes still alive once they had time to end.

    Not the notebook's children: the forkserver refills its pool of idle workers
    after a run, on its own schedule (the leftover check covers the pool)."""
    return (*threads_and_fds(), len(wait_gone(timeout=10.0)))


@pytest.fixture
def warm() -> Iterator[None]:
    """One launch first (loop thread, forkserver and its pool exist), then count."""
    nbddp.launch(fns.all_reduce_sum, 0.0, procs=2, output="none")
    yield


@pytest.fixture
def deleted_cwd(tmp_path: Path) -> Iterator[Path]:
    here = os.getcwd()
    gone = tmp_path / "gone"
    gone.mkdir()
    os.chdir(gone)
    gone.rmdir()
    try:
        yield gone
    finally:
        os.chdir(here)


@pytest.mark.parametrize("method", ["forkserver", "spawn", "fork"])
def test_a_launch_from_a_deleted_directory_is_a_config_error_that_leaks_nothing(
    method: str, warm: None, deleted_cwd: Path
) -> None:
    before = _resources()
    for _ in range(3):
        with pytest.raises(ConfigError) as info:
            nbddp.launch(fns.all_reduce_sum, 0.0, procs=2, output="none", start_method=method)
        message = str(info.value)
        assert "\n" not in message
        assert "working directory" in message and "os.chdir" in message
    assert _resources() == before


def test_a_variable_too_long_for_a_new_process_is_a_config_error_for_spawn(
    warm: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NBDDP_TEST_BIG", "x" * BIG)
    before = _resources()
    for _ in range(3):
        with pytest.raises(ConfigError) as info:
            nbddp.launch(fns.all_reduce_sum, 0.0, procs=2, output="none", start_method="spawn")
        message = str(info.value)
        assert "\n" not in message
        assert "NBDDP_TEST_BIG" in message and "forkserver" in message
    assert _resources() == before
    with pytest.raises(ConfigError, match="NBDDP_TEST_BIG"):
        nbddp.launch(fns.all_reduce_sum, 0.0, procs=2, start_method="spawn", env={})
    monkeypatch.delenv("NBDDP_TEST_BIG")
    with pytest.raises(ConfigError, match="BIG_FROM_ENV"):
        nbddp.launch(
            fns.all_reduce_sum, 0.0, procs=2, start_method="spawn", env={"BIG_FROM_ENV": "y" * BIG}
        )


def rank_sees(name: str) -> int:
    return len(os.environ.get(name, ""))


def test_a_restarted_forkserver_starts_with_a_variable_too_long_for_a_new_process(
    warm: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NBDDP_TEST_BIG", "x" * BIG)
    FORKSERVER.close()  # the next launch starts a new one, in this environment
    try:
        before = _resources()
        # The ranks still get the variable: their environment travels in their order.
        assert nbddp.launch(rank_sees, "NBDDP_TEST_BIG", procs=2, output="none") == BIG
    finally:
        FORKSERVER.close()  # later tests get a forkserver started without it
    assert _resources()[1] <= before[1]


def test_rows_logged_in_dataloader_workers_all_arrive() -> None:
    result = nbddp.launch(failing.log_in_dataloader_workers, procs=2, output="none", block=False)
    done = result.wait()
    assert done.values == {0: sum(range(failing.ROWS)), 1: sum(range(failing.ROWS))}
    for rank in (0, 1):
        items = sorted(int(r["item"] or 0) for r in done.metrics if r["rank"] == rank)
        assert items == list(range(failing.ROWS))


def test_rows_logged_in_children_forked_with_os_fork_all_arrive() -> None:
    done = nbddp.launch(failing.log_in_forked_children, procs=2, output="none", block=False).wait()
    assert done.values == {0: 2, 1: 2}
    for rank in (0, 1):
        items = sorted(int(r["item"] or 0) for r in done.metrics if r["rank"] == rank)
        assert items == list(range(failing.ROWS))


@pytest.mark.parametrize("how", ["return", "raise"])
def test_a_forked_child_that_returns_into_nbddp_never_speaks_for_its_rank(how: str) -> None:
    for _ in range(3):
        done = nbddp.launch(
            failing.fork_child_returns_late, how, procs=2, output="none", block=False
        ).wait()
        assert done.values == {0: "the rank's value", 1: "the rank's value"}


@pytest.mark.parametrize(
    ("fn", "type_name"),
    [
        (failing.raise_str_raises, "StrRaises"),
        (failing.raise_rebuilds_as_int, "RebuildsAsInt"),
    ],
)
def test_an_exception_that_resists_description_arrives_as_a_remote_error(
    fn: object, type_name: str, warm: None
) -> None:
    before = _resources()
    with pytest.raises(RemoteError) as info:
        nbddp.launch(fn, procs=2, output="none")
    error = info.value
    assert error.remote_type == f"tests.multiproc.failing.{type_name}"
    assert type_name in str(error)
    assert f"raise {type_name}(" in error.remote_traceback
    assert _resources() == before


def test_logging_in_a_spawned_dataloader_worker_says_it_cannot_reach_the_notebook() -> None:
    with pytest.raises(RuntimeError) as info:
        nbddp.launch(failing.log_in_spawned_dataloader_workers, procs=2, output="none")
    assert "nbddp.log works in a rank and in the processes it forks" in str(info.value)


def test_an_interrupt_while_the_forkserver_process_starts_leaves_nothing_behind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The kernel's interrupt (SIGINT) can land while Popen waits for the new process
    # to exec: the process exists, but Popen never returns it.
    import signal
    import subprocess

    nbddp.launch(fns.all_reduce_sum, 0.0, procs=2, output="none")  # the loop thread exists
    FORKSERVER.close()
    before = threads_and_fds()
    real = subprocess.Popen
    started: list[int] = []

    def interrupted(*args: object, **kwargs: object) -> subprocess.Popen[bytes]:
        proc = real(*args, **kwargs)  # type: ignore[call-overload]
        started.append(proc.pid)
        signal.raise_signal(signal.SIGINT)  # arrives before Popen hands the process over
        return proc  # type: ignore[no-any-return]

    monkeypatch.setattr(subprocess, "Popen", interrupted)
    with pytest.raises(KeyboardInterrupt) as caught:
        nbddp.launch(fns.all_reduce_sum, 0.0, procs=2, output="none")
    monkeypatch.setattr(subprocess, "Popen", real)
    kept = caught.value.__traceback__  # as IPython keeps it (``%debug``): its frames live on
    assert nbddp.launch(fns.all_reduce_sum, 1.0, procs=2, output="none") == 3.0
    FORKSERVER.close()
    assert _ended(started[0])
    assert (threading.active_count(), psutil.Process().num_fds()) == before
    del kept


@pytest.mark.parametrize("where", ["sending the run orders", "making the run's handle"])
def test_an_interrupt_once_the_ranks_exist_stops_them_and_leaks_nothing(
    where: str, warm: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The kernel's interrupt can land after the ranks were forked and before the
    # notebook holds the run: none of them may outlive the KeyboardInterrupt.
    import signal

    from nbddp import entry
    from nbddp.launcher.relay import Relay

    before = _resources()
    if where == "sending the run orders":
        real_attach = Relay.attach

        def attach(self: Relay, rank: int, pipes: object) -> None:
            real_attach(self, rank, pipes)  # type: ignore[arg-type]
            if rank == 0:  # rank 0 has its order and runs; rank 1 has none yet
                signal.raise_signal(signal.SIGINT)

        monkeypatch.setattr(Relay, "attach", attach)
    else:
        real_run = entry.Run

        def run(*args: object) -> object:
            signal.raise_signal(signal.SIGINT)
            return real_run(*args)  # type: ignore[arg-type]

        monkeypatch.setattr(entry, "Run", run)
    with pytest.raises(KeyboardInterrupt) as caught:
        nbddp.launch(fns.hang, procs=2, output="none")
    monkeypatch.undo()
    shown = caught.value._render_traceback_()  # type: ignore[attr-defined]  # as IPython shows it
    assert shown == ["KeyboardInterrupt: interrupted while the ranks were starting; none was left"]
    assert _resources() == before
    assert nbddp.launch(fns.all_reduce_sum, 1.0, procs=2, output="none") == 3.0


def _ended(pid: int) -> bool:
    """Whether process ``pid`` is gone, or goes within seconds."""
    try:
        proc = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return True
    return psutil.wait_procs([proc], timeout=10)[1] == []


CELL_FILE = "/tmp/ipykernel_0/2718281828.py"
CELL = FAILING_TRAIN


class _Compiler:
    """IPython's compiler as far as naming its cells goes: ``CELL_FILE`` is cell 4."""

    def format_code_name(self, name: str) -> tuple[str, str] | None:
        return ("Cell", "In[4]") if name == CELL_FILE else None


def test_a_notebook_function_failing_on_one_rank_shows_its_cell_and_why_the_other_stopped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # As IPython leaves a cell: its lines in linecache only, its name known to the shell.
    shell = type("Shell", (), {"compile": _Compiler()})()
    monkeypatch.setitem(sys.modules, "IPython", type("IPython", (), {"get_ipython": lambda: shell}))
    monkeypatch.setitem(
        linecache.cache, CELL_FILE, (len(CELL), None, CELL.splitlines(keepends=True), CELL_FILE)
    )
    namespace: dict[str, object] = {"__name__": "__main__"}
    exec(compile(CELL, CELL_FILE, "exec"), namespace)
    with pytest.raises(ValueError, match="bad batch on rank 1") as raised:
        nbddp.launch(namespace["train"], 10_000, procs=2, output="none")
    shown = "\n".join(raised.value._render_traceback_())  # type: ignore[attr-defined]
    assert '  Cell In[4], line 7, in train\n    raise ValueError("bad batch on rank 1")' in shown
    assert os.path.dirname(nbddp.__file__) not in shown  # nbddp's frames stay in the log
    assert re.search(r"^rank 0: stopped (in a collective )?after rank 1 failed", shown, re.M)
    log = shown.rsplit("full output in ", 1)[1]
    assert log.endswith("rank1.log") and "\n" not in log  # the path ends the lines
    logged = Path(log).read_text()
    assert "nbddp/rank/worker.py" in logged and "Cell In[4], line 7, in train" in logged


def test_an_interrupt_before_the_forkserver_answers_leaves_it_to_no_one_at_exit(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The interrupt lands while the new forkserver still imports torch (held here
    # before its imports): it has the first request and has answered nothing. Then
    # the notebook exits, and is killed while its exit handler stops the forkserver,
    # as jupyter_client kills a kernel that takes seconds to shut down.
    import subprocess

    from nbddp.launcher import forkserver_link

    FORKSERVER.close()
    before = threads_and_fds()
    hold = tmp_path / "hold"
    os.mkfifo(hold)
    (tmp_path / "sitecustomize.py").write_text(
        "import os\n"
        "if os.environ.get('NBDDP_ROLE') == 'forkserver':\n"
        "    open(os.environ['NBDDP_TEST_HOLD'])  # a FIFO no one writes: held here\n"
    )
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), *sys.path]))
    monkeypatch.setenv("NBDDP_TEST_HOLD", str(hold))

    def interrupted(status_r: int, timeout: float) -> int | None:
        raise KeyboardInterrupt

    monkeypatch.setattr(forkserver_link, "read_pid", interrupted)
    with pytest.raises(KeyboardInterrupt):
        nbddp.launch(fns.all_reduce_sum, 0.0, procs=2, output="none")
    pid = FORKSERVER.pid
    assert pid is not None
    server = psutil.Process(pid)

    class Killed(BaseException):
        """The notebook's process, killed where it waits."""

    def killed(self: subprocess.Popen[bytes], timeout: float | None = None) -> int:
        raise Killed

    monkeypatch.setattr(subprocess.Popen, "wait", killed)
    with pytest.raises(Killed):
        FORKSERVER.close()
    monkeypatch.undo()
    left = wait_procs_gone([server], timeout=10.0)
    with contextlib.suppress(psutil.NoSuchProcess):
        server.kill()
    FORKSERVER.close()
    assert not left, "the forkserver outlived the notebook's exit"
    assert threads_and_fds() == before
