"""A process forked from the notebook (accelerate's notebook_launcher, a DataLoader's
workers, ``os.fork``) can use what nbddp keeps there, whatever nbddp's own threads
held at the moment of the fork: a child has only the thread that forked."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
from collections.abc import Callable, Iterator

import pytest

from nbddp.launcher import relay
from nbddp.launcher.fds import NOTEBOOK_FDS
from nbddp.launcher.forkserver_link import FORKSERVER


def _keep_an_fd() -> None:
    NOTEBOOK_FDS.keep(1_000_000)


def _use_the_relay_loop() -> None:
    ran = threading.Event()
    relay.loop().call(ran.set)
    assert ran.wait(10)


def _close_the_forkserver_link() -> None:
    FORKSERVER.close()  # what the child's exit handlers do


CHILD_USES: dict[
    str, tuple[Callable[[], contextlib.AbstractContextManager[object]], Callable[[], None]]
] = {
    "kept fds": (NOTEBOOK_FDS.frozen, _keep_an_fd),
    "relay loop": (lambda: relay._LOOP_LOCK, _use_the_relay_loop),
    "forkserver link": (lambda: FORKSERVER._lock, _close_the_forkserver_link),
}


@contextlib.contextmanager
def held_on_the_relay_thread(
    lock: Callable[[], contextlib.AbstractContextManager[object]],
) -> Iterator[None]:
    """``lock`` held by nbddp's relay thread (as its work holds it) during the block."""
    held, go = threading.Event(), threading.Event()

    def hold() -> None:
        with lock():
            held.set()
            go.wait(30)

    relay.loop().call(hold)
    assert held.wait(10)
    try:
        yield
    finally:
        go.set()


@pytest.mark.parametrize("what", list(CHILD_USES))
def test_a_child_forked_while_nbddps_thread_holds_a_lock_can_use_it(what: str) -> None:
    lock, use = CHILD_USES[what]
    relay.loop()  # the thread exists before the fork, as after any launch
    done_r, done_w = os.pipe()
    with held_on_the_relay_thread(lock):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            try:
                use()
                os.write(done_w, b"ok")
            finally:
                os._exit(0)
    os.close(done_w)
    try:
        ready, _, _ = select.select([done_r], [], [], 10)
        assert ready and os.read(done_r, 2) == b"ok", f"the child hung on nbddp's {what}"
    finally:
        os.close(done_r)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
