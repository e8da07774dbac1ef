"""Sessions through the Python API on 2 gloo ranks: state kept, failures, interrupts, ends.

Each test also gets the leftover-process check (tests/conftest.py); tests that end
a session check its ranks are gone, and failure paths check fds and threads.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import select
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

import nbddp
from nbddp.notebook.session import Session
from tests.displays import Notices
from tests.multiproc import session_fns as fns
from tests.procs import threads_and_fds as _resources
from tests.procs import wait_gone


@pytest.fixture
def session() -> Iterator[Session]:
    with nbddp.session(procs=2, output="none") as s:
        yield s


class Recording(Notices):
    """A display that keeps every rank's output and the notices; ``waiting`` is set
    once every rank has printed ``waiting``."""

    def __init__(self) -> None:
        super().__init__()
        self.text: dict[int, str] = {}
        self.waiting = threading.Event()

    def attach(self, log_dir: Path, world_size: int) -> None:
        self.text = dict.fromkeys(range(world_size), "")

    def output(self, rank: int, stream: str, text: str) -> None:
        self.text[rank] += text
        if all("waiting" in t for t in self.text.values()):
            self.waiting.set()


def _gone(pids: dict[int, int]) -> bool:
    return wait_gone(pids=set(pids.values()), timeout=10.0) == []


def _start(session: Session, fn: Any, *args: Any, timeout: float | None = None) -> Any:
    """Start ``fn`` as the session's next cell, recorded; (run, display)."""
    display = Recording()
    config = dataclasses.replace(
        session.config, job=dataclasses.replace(session.config.job, timeout=timeout)
    )
    return session.run_call(fn, args, {}, config, display), display


def test_each_rank_keeps_its_state_and_its_process_group_from_call_to_call(
    session: Session,
) -> None:
    first = session.run(fns.identity)
    session.run(fns.keep, "step", 41)
    assert session.run(fns.kept, "step") == 41
    assert session.run(fns.identity) == first  # same processes, same group object
    assert len({pid for pid, _ in first}) == 2


def test_a_cell_binds_names_that_stay_the_ranks_and_reads_the_rest_from_the_caller(
    session: Session,
) -> None:
    assert session.exec("a = rank * 10\nb = 5\na") == 0
    # ``a`` belongs to the ranks: the caller's ``a`` is not sent; ``c`` is.
    assert session.exec("a + b + c", {"a": -1, "c": 100}) == 105
    assert {"a", "b"} <= set(session.names)
    assert "c" not in session.names  # read, never bound by a cell


def test_every_line_a_cell_prints_is_shown_with_that_cell(session: Session) -> None:
    for count in (1, 3000):
        run, display = _start(session, fns.print_lines, count)
        run.wait()
        for rank in (0, 1):
            lines = display.text[rank].splitlines()
            assert lines == [f"rank {rank} line {i}" for i in range(count)]


def test_a_failing_cell_keeps_the_session_and_leaks_nothing(session: Session) -> None:
    session.run(fns.keep, "x", "kept")
    with pytest.raises(ValueError):  # warm: each path once before counting
        session.run(fns.fail_on, 0)
    threads, fds = _resources()
    for rank in (0, 1, 1):
        with pytest.raises(ValueError, match=f"rank {rank} fails its cell") as info:
            session.run(fns.fail_on, rank)
        assert "the session keeps its state" in info.value.__notes__[-1]
    assert session.alive and session.run(fns.kept, "x") == "kept"
    assert _resources() == (threads, fds)


def test_ranks_blocked_in_a_collective_are_freed_and_get_a_new_process_group(
    session: Session,
) -> None:
    session.run(fns.keep, "x", "kept")
    pids = session.pids
    started = time.monotonic()
    with pytest.raises(ValueError, match="raised before the all_reduce") as info:
        session.run(fns.fail_before_all_reduce, 1)
    # failure grace + interrupt grace + freeing, not gloo's 30 minutes
    assert time.monotonic() - started < 15
    note = info.value.__notes__[-1]
    assert "process group was closed to free it and re-initialised" in note
    assert "DistributedDataParallel wrapper" in note
    assert session.alive and session.pids == pids
    assert session.run(fns.kept, "x") == "kept"  # the state is kept
    assert session.run(fns.all_reduce_sum) == 2.0  # the new group works


def test_a_rank_that_cannot_be_freed_ends_the_session_within_seconds(
    session: Session,
) -> None:
    pids = session.pids
    started = time.monotonic()
    with pytest.raises(ValueError, match="raised while a peer is stuck") as info:
        session.run(fns.fail_while_a_peer_is_stuck, 1)
    assert time.monotonic() - started < 15
    note = info.value.__notes__[-1]
    assert "rank(s) 0 did not return to idle" in note and "state is lost" in note
    assert not session.alive and _gone(pids)
    with pytest.raises(nbddp.SessionError, match="session has ended"):
        session.run(fns.kept, "x")
    session.restart()
    assert session.run(fns.print_lines, 0) == 0


def test_a_rank_killed_ends_the_session_naming_the_rank_and_the_signal() -> None:
    nbddp.session(procs=2, output="none").stop()  # warm: the relay's loop, the forkserver
    threads, fds = _resources()
    session = nbddp.session(procs=2, output="none")
    run, _ = _start(session, fns.kill_self_on, 1)
    pids = run.pids
    with pytest.raises(nbddp.RankExitedError, match="rank 1 was killed by signal SIGKILL") as info:
        session.finish(run)
    assert "the session has ended (rank 1 was killed by signal SIGKILL" in info.value.__notes__[-1]
    assert not session.alive and _gone(pids)
    session.stop()
    assert _resources() == (threads, fds)


class Waiting:
    """A cell waited for (its output shown) in a thread of its own, while the test acts."""

    def __init__(self, session: Session, fn: Any) -> None:
        self.run, self.display = _start(session, fn)
        self.raised: BaseException | None = None
        self._thread = threading.Thread(target=self._wait)
        self._thread.start()
        assert self.display.waiting.wait(30), self.display.text  # every rank is in the cell

    def _wait(self) -> None:
        try:
            self.run.wait()
        except BaseException as exc:
            self.raised = exc

    def join(self) -> BaseException | None:
        self._thread.join(30)
        assert not self._thread.is_alive()
        return self.raised


def test_stopping_a_cell_interrupts_every_rank_and_keeps_the_state(session: Session) -> None:
    session.run(fns.keep, "x", 7)
    cell = Waiting(session, fns.wait_forever)
    stopped = time.monotonic()
    cell.run.stop()
    raised = cell.join()
    assert time.monotonic() - stopped < 5
    assert isinstance(raised, nbddp.RankError) and "stopped" in str(raised)
    assert cell.run.status == "stopped" and session.alive
    assert session.run(fns.kept, "x") == 7


def test_an_interrupt_whose_signal_was_lost_is_repeated_until_taken(session: Session) -> None:
    cell = Waiting(session, fns.lose_the_first_interrupt)
    stopped = time.monotonic()
    cell.run.stop()
    raised = cell.join()
    assert isinstance(raised, nbddp.RankError) and "stopped" in str(raised)
    assert time.monotonic() - stopped < 3  # before the cell would give up on the rank
    assert session.alive


def test_an_interrupt_that_comes_before_the_cell_begins_still_stops_it(session: Session) -> None:
    for _ in range(5):
        run, _ = _start(session, fns.wait_forever)
        run.stop()  # at once: the ranks may not have begun the cell yet
        with pytest.raises(nbddp.RankError):
            run.wait()
        assert session.alive


def test_a_cells_timeout_dumps_every_ranks_stacks_then_interrupts_it(session: Session) -> None:
    session.run(fns.keep, "x", 7)
    run, display = _start(session, fns.wait_forever, timeout=1.0)
    with pytest.raises(nbddp.LaunchTimeout, match="timeout of 1s") as info:
        session.finish(run)
    assert "the session keeps its state" in info.value.__notes__[-1]
    for rank in (0, 1):
        assert "wait_forever" in display.text[rank]  # its stack, in its own output
    assert session.run(fns.kept, "x") == 7


def test_a_second_cell_while_one_runs_is_refused_and_changes_nothing(session: Session) -> None:
    cell = Waiting(session, fns.wait_forever)
    with pytest.raises(nbddp.SessionError, match="another cell of this session is still running"):
        session.run(fns.kept, "x")
    cell.run.stop()
    assert isinstance(cell.join(), nbddp.RankError)
    assert session.run(fns.print_lines, 0) == 0


def test_stop_ends_every_rank_and_restart_starts_fresh_ones(session: Session) -> None:
    session.run(fns.keep, "x", 1)
    before = session.run(fns.identity)
    session.restart()
    after = session.run(fns.identity)
    assert {pid for pid, _ in after}.isdisjoint({pid for pid, _ in before})
    assert wait_gone(pids={pid for pid, _ in before}, timeout=10.0) == []
    with pytest.raises(KeyError):
        session.run(fns.kept, "x")  # fresh ranks: nothing kept
    session.stop()
    assert wait_gone(pids={pid for pid, _ in after}, timeout=10.0) == []
    with pytest.raises(nbddp.SessionError, match="no session is running"):
        session.run(fns.kept, "x")


def test_bad_session_options_are_refused_before_anything_starts() -> None:
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(nbddp.ConfigError, match="max_restarts does not apply to a session"):
        nbddp.session(procs=2, max_restarts=1)
    with pytest.raises(nbddp.ConfigError):
        nbddp.session(procs=0)
    after = {p.pid for p in psutil.Process().children(recursive=True)}
    assert after <= before | _forkserver()


def _forkserver() -> set[int]:
    from nbddp.launcher.forkserver_link import FORKSERVER

    pid = FORKSERVER.pid
    if pid is None:
        return set()
    # The forkserver's pool refills in the background: its keepers and idle ranks.
    return {pid, *(p.pid for p in psutil.Process(pid).children(recursive=True))}


def test_a_session_dropped_without_stop_ends_its_ranks() -> None:
    # As when a kernel's magics are reloaded: nothing else would end these ranks
    # before the kernel exits.
    dropped = nbddp.session(procs=2, output="none")
    pids = dropped.pids
    del dropped
    assert _gone(pids)


def test_a_cells_timeout_takes_a_c_level_dump_of_a_rank_holding_the_gil(
    session: Session,
) -> None:
    from tests.multiproc import fns as run_fns

    pids = session.pids
    run, display = _start(session, run_fns.stuck_holding_the_gil, timeout=2.0)
    with pytest.raises(nbddp.LaunchTimeout) as info:
        session.finish(run)
    assert "ranks 0, 1 did not answer (a thread held the GIL)" in str(info.value)
    assert any("did not answer for its stacks" in n for n in display.notices)
    for rank in (0, 1):
        log = run.output(rank)
        assert "in stuck_holding_the_gil" in log  # faulthandler's dump, from C
    # The regex never gives the GIL back: the interrupt cannot land, the session ends.
    assert "state is lost" in info.value.__notes__[-1]
    assert _gone(pids)


def test_a_child_forked_beside_a_session_exits_without_waiting_on_it(session: Session) -> None:
    # A child of the notebook (an ``os.fork()`` that returns, so that its exit handlers
    # run) inherits the session's exit handler: the session is the notebook's, not its.
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            finalizer = session._finalizer
            assert finalizer is not None
            finalizer()  # what the exit of a child that returns runs
            os.write(done_w, b"ok")
        finally:
            os._exit(0)
    os.close(done_w)
    try:
        ready, _, _ = select.select([done_r], [], [], 5)  # ending a session waits up to 10 s
        assert ready and os.read(done_r, 2) == b"ok", "the child's exit waited on the session"
    finally:
        os.close(done_r)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    first = session.run(fns.identity)
    assert session.run(fns.identity) == first  # the notebook's session goes on, the same
