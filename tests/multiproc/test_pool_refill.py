"""When the forkserver refills its pool: while a run goes on if the machine has a core
its ranks leave spare, so that a launch right after the run (a sweep's loop) is
served by the pool too.

Waits are on conditions with deadlines, never on sleeps.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

import nbddp
from nbddp.launcher.starters import FORKSERVER
from tests.multiproc import fns
from tests.procs import idle_of, wait_pool

pytestmark = pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2, reason="needs a core that one rank leaves spare"
)


@pytest.fixture
def cores_alone(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A forkserver that counts spare cores alone (``NBDDP_POOL_STALL=1``): how busy
    the machine running the tests is must not decide what the test sees. The
    pressure rule has unit tests of its own (tests/unit/test_pool_refill.py)."""
    monkeypatch.setenv("NBDDP_POOL_STALL", "1")
    FORKSERVER.close()  # the next launch starts one with this environment
    yield
    FORKSERVER.close()  # the next test's forkserver has the default again


def wait_idle_while(run: nbddp.Run, forkserver: int, size: int, timeout: float = 10.0) -> None:
    """Wait until ``forkserver`` has ``size`` idle workers while ``run`` still goes on."""
    deadline = time.monotonic() + timeout
    while len(idle_of(forkserver)) != size:
        assert not run.ended(), "the run ended first"
        assert time.monotonic() < deadline, f"no refill during the run: {idle_of(forkserver)}"
        psutil.wait_procs(psutil.Process(forkserver).children(), timeout=0.02)


def test_with_a_core_to_spare_the_pool_refills_during_the_run_and_serves_the_next_launch(
    tmp_path: Path, cores_alone: None
) -> None:
    assert nbddp.launch(fns.all_reduce_sum, 0.0, procs=1, output="none") == 0.0
    forkserver = FORKSERVER.pid
    assert forkserver is not None
    wait_pool(forkserver, 1)
    fifo = tmp_path / "go"
    os.mkfifo(f"{fifo}.0")
    run = nbddp.launch(fns.wait_on_fifo, str(fifo), procs=1, block=False, output="none")
    try:
        wait_idle_while(run, forkserver, 1)
        refilled = {p.pid for p in idle_of(forkserver)}
    finally:
        with open(f"{fifo}.0", "w") as f:
            f.write("go\n")
    assert run.wait().values == {0: "go"}
    # Right after the run, as a loop launches: the worker refilled during the run serves it.
    after = nbddp.launch(fns.find_state, procs=1, block=False, output="none").wait()
    assert {s["pid"] for s in after.values.values()} == refilled
