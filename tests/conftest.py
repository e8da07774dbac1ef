"""Shared fixtures. Every test that starts processes checks that none is left: the
directories whose tests start them (multiproc, kernel, browser, gpu) make
``no_leftovers`` autouse in their own conftest.

``NBDDP_TEST_SESSION`` is set before nbddp is imported, so the forkserver, the
workers and any kernel a test starts all carry it (see ``tests/procs.py``).
So is ``NBDDP_LOG_DIR``: the session's run logs go to a directory of its own,
never the user's, removed when the session ends.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator

import pytest

os.environ.setdefault("NBDDP_TEST_SESSION", uuid.uuid4().hex)
# Always ours (never setdefault): the user's own NBDDP_LOG_DIR is removed by no test.
os.environ["NBDDP_LOG_DIR"] = tempfile.mkdtemp(prefix="nbddp-test-logs-")

from tests.procs import POOL_CAP, ours, stray_idle, wait_gone

LOG_DIR = os.environ["NBDDP_LOG_DIR"]


@pytest.fixture
def no_leftovers() -> Iterator[None]:
    """Fail the test if any worker (or a worker's child) outlives it.

    Idle pool workers are the forkserver's, not the test's: they may stay, but
    only as children of a live forkserver and no more than its pool may hold."""
    before = {p.pid for p in ours()}
    yield
    survivors = [p for p in wait_gone(timeout=10.0) if p.pid not in before]
    survivors += stray_idle(max(POOL_CAP, int(os.environ.get("NBDDP_POOL", "0") or 0)))
    for proc in survivors:
        proc.kill()
    assert not survivors, f"worker processes left behind: {[p.pid for p in survivors]}"


def pytest_unconfigure() -> None:
    shutil.rmtree(LOG_DIR, ignore_errors=True)
