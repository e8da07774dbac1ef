"""The same runs from a notebook outside the cluster, through Ray Client (``ray://``)."""

from __future__ import annotations

from tests.cluster.conftest import CLIENT_PORT, HEAD
from tests.cluster.notebook import kill_it_and_wait_for_its_ranks, results_through

ADDRESS = f"ray://{HEAD}:{CLIENT_PORT}"


def test_a_client_notebook_gets_values_and_the_ranks_own_exception(cluster: object) -> None:
    out = results_through(ADDRESS)
    assert "ENV 0 4 0\n" in out
    assert "RAISED StepFailed step failed on rank 2\n" in out


def test_a_killed_client_notebooks_ranks_are_gone_within_10s(cluster: object) -> None:
    gone = kill_it_and_wait_for_its_ranks(ADDRESS)
    print(f"ranks gone {gone:.2f}s after the client notebook was killed")
