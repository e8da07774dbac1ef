"""The same runs from a notebook outside the cluster, through Ray Client (``ray://``)."""

from __future__ import annotations

import pytest

from nbddp.agent.node import QUIET
from tests.cluster.conftest import CLIENT_PORT, HEAD
from tests.cluster.notebook import kill_it_and_wait_for_its_ranks, results_through

ADDRESS = f"ray://{HEAD}:{CLIENT_PORT}"
# Each test's stand-in notebook starts cold through Ray Client (its server process, new
# agents and forkservers on two one-CPU nodes): on a loaded machine, minutes.
pytestmark = pytest.mark.timeout(300)


def test_a_client_notebook_gets_values_and_the_ranks_own_exception(cluster: object) -> None:
    out = results_through(ADDRESS)
    assert "ENV 0 4 0\n" in out
    assert "RAISED StepFailed step failed on rank 2\n" in out


def test_a_killed_client_notebooks_ranks_are_gone_soon_after_the_agents_last_poll(
    cluster: object,
) -> None:
    # Ray's own clean-up of a lost Ray Client driver takes 30 s; nbddp's agents end
    # themselves ``QUIET`` seconds after the notebook's last poll, also when a thread of
    # theirs holds the GIL meanwhile (under load, a garbage collection blocked in Ray).
    gone = kill_it_and_wait_for_its_ranks(ADDRESS, within=QUIET + 8)
    print(f"ranks gone {gone:.2f}s after the client notebook was killed")
