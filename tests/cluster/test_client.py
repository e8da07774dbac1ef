"""The same runs from a notebook outside the cluster, through Ray Client (``ray://``)."""

from __future__ import annotations

import time

import psutil

from tests.cluster.conftest import CLIENT_PORT, HEAD, kill_tree
from tests.cluster.notebook import results_through, stand_in_notebook
from tests.procs import wait_procs_gone

ADDRESS = f"ray://{HEAD}:{CLIENT_PORT}"


def test_a_client_notebook_gets_values_and_the_ranks_own_exception(cluster: object) -> None:
    out = results_through(ADDRESS)
    assert "ENV 0 4 0\n" in out
    assert "RAISED StepFailed step failed on rank 2\n" in out


def test_a_killed_client_notebooks_ranks_are_gone_within_10s(cluster: object) -> None:
    proc, pids = stand_in_notebook(ADDRESS)
    ranks = [psutil.Process(pid) for pid in pids]
    killed = time.monotonic()
    kill_tree(proc.pid)
    proc.wait()
    left = wait_procs_gone(ranks, timeout=10)
    assert not left, f"ranks alive 10 s after the notebook was killed: {[p.pid for p in left]}"
    print(f"ranks gone {time.monotonic() - killed:.2f}s after the client notebook was killed")
