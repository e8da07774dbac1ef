"""max_restarts: after a failure every rank is stopped and the group restarted (2 gloo ranks)."""

from __future__ import annotations

import multiprocessing
import threading

import psutil
import pytest

import nbddp
from nbddp.entry import start_with_display
from nbddp.launcher.config import LaunchConfig
from tests.displays import Notices
from tests.multiproc import mpfns


def test_a_function_that_fails_twice_returns_its_value_with_two_restarts() -> None:
    assert nbddp.launch(mpfns.fail_until_attempt, 2, procs=2, max_restarts=2) == 2


def test_a_function_that_fails_twice_raises_its_error_with_one_restart() -> None:
    with pytest.raises(ValueError, match="failing on attempt 1"):
        nbddp.launch(mpfns.fail_until_attempt, 2, procs=2, max_restarts=1)


def test_notebook_launcher_takes_max_restarts() -> None:
    assert nbddp.notebook_launcher(mpfns.fail_until_attempt, (1,), 2, max_restarts=1) == 1


def test_each_restart_is_announced_with_the_failure_that_caused_it() -> None:
    display = Notices()
    config = LaunchConfig.build(procs=2, max_restarts=2)
    run = start_with_display(config, mpfns.fail_until_attempt, (2,), {}, display)
    assert run.wait().values == {0: 2, 1: 2}
    restarts = [n for n in display.notices if "restarting every rank" in n]
    assert len(restarts) == 2
    assert "restart 1 of 2" in restarts[0] and "restart 2 of 2" in restarts[1]
    assert "ValueError: failing on attempt 0" in restarts[0]
    assert "ValueError: failing on attempt 1" in restarts[1]


def test_a_restart_leaves_nothing_of_the_previous_attempt() -> None:
    nbddp.launch(mpfns.fail_until_attempt, 0, procs=2)  # warm: loop thread, forkserver
    queue = multiprocessing.get_context("spawn").SimpleQueue()
    me = psutil.Process()
    threads, fds = threading.active_count(), me.num_fds()
    assert nbddp.launch(mpfns.pid_and_fail_until, 1, queue, procs=2, max_restarts=1) == 1
    seen = [queue.get() for _ in range(4)]
    first = {pid for count, pid in seen if count == 0}
    assert len(first) == 2 and {count for count, _ in seen} == {0, 1}
    assert not any(psutil.pid_exists(pid) for pid in first)  # none of the first attempt is left
    assert threading.active_count() <= threads
    assert me.num_fds() <= fds
