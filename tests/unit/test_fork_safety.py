"""A process forked from the notebook (accelerate's notebook_launcher, a DataLoader's
workers, ``os.fork``) can use what nbddp keeps there, whatever nbddp's own threads
held at the moment of the fork: a child has only the thread that forked."""

from __future__ import annotations

import contextlib
import importlib
import os
import select
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

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


HELD = "nbddp_test_held_import"
ENTERED, GATE, JOINED = threading.Event(), threading.Event(), threading.Event()


def test_a_child_forked_while_the_prewarm_thread_imports_can_import_the_same(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The prewarm thread is held inside an import (torch's takes seconds): a child
    # forked then would find that module's import lock held by a thread it lacks.
    from nbddp import prewarm

    (tmp_path / f"{HELD}.py").write_text(
        f"import {__name__} as t\nt.ENTERED.set()\nassert t.GATE.wait(30)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(prewarm, "_import_launch", lambda: importlib.import_module(HELD))
    monkeypatch.setattr(prewarm, "interactive", lambda: True)
    monkeypatch.setattr(FORKSERVER, "prewarm", lambda: None)
    # The gate opens once the fork waits for the prewarm thread, if it does at all.
    opener = threading.Thread(target=lambda: JOINED.wait(10) and GATE.set())
    opener.start()

    real = threading.Thread

    class NotedJoin(real):
        def join(self, timeout: float | None = None) -> None:
            JOINED.set()
            super().join(timeout)

    monkeypatch.setattr(threading, "Thread", NotedJoin)
    prewarm.start()
    monkeypatch.setattr(threading, "Thread", real)
    assert ENTERED.wait(10)
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            importlib.import_module(HELD)
            os.write(done_w, b"ok")
        finally:
            os._exit(0)
    os.close(done_w)
    try:
        ready, _, _ = select.select([done_r], [], [], 10)
        assert ready and os.read(done_r, 2) == b"ok", "the child hung on the prewarm's import"
    finally:
        GATE.set()
        opener.join()
        os.close(done_r)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        sys.modules.pop(HELD, None)
