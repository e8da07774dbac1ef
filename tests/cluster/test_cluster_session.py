"""A session across the two nodes of the local cluster: the same guarantees as on one
machine (state and process group kept from cell to cell, the name rule, a failing cell
keeping the state, interrupt), and a rank that dies, or a notebook that is killed,
ending it with nothing left on any node."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import nbddp
from nbddp.agent.portable import ShippedPayload
from nbddp.cluster import agents as nodes
from nbddp.errors import RankExitedError
from nbddp.notebook.session import Session
from nbddp.wire.payload import Payload
from nbddp.wire.shm import Mark
from tests.cluster.conftest import WORKER, newest
from tests.cluster.notebook import kill_it_and_wait_for_its_ranks
from tests.procs import wait_procs_gone

GATHER = (
    "import torch.distributed as dist\n"
    "everyone = [None] * world_size\n"
    "dist.all_gather_object(everyone, {probe})\n"
    "everyone\n"
)


@pytest.fixture(scope="module")
def session(cluster: object) -> Iterator[Session]:
    with nbddp.session(nodes=2, procs=1, cluster=cluster.address) as s:  # type: ignore[attr-defined]
        yield s


def test_state_and_the_process_group_stay_across_cells_on_both_nodes(session: Session) -> None:
    session.exec("import os\nnode = os.environ['NODE_RANK']\nvalue = 10 * rank\n")
    assert session.exec(GATHER.format(probe="(node, value)")) == [("0", 0), ("1", 10)]
    session.exec("value += 1")
    assert session.exec(GATHER.format(probe="value")) == [1, 11]
    assert {"node", "value", "dist"} <= set(session.names)


def test_a_notebook_name_is_sent_for_its_cell_only(session: Session) -> None:
    assert session.exec("step * 2", {"step": 21}) == 42
    assert session.exec(GATHER.format(probe="'step' in globals()")) == [False, False]


def test_a_failing_cell_on_node_1_keeps_the_state(session: Session) -> None:
    with pytest.raises(LookupError, match="missing on node 1") as info:
        session.exec("if rank == 1:\n    raise LookupError('missing on node 1')\n")
    assert "the session keeps its state" in "".join(info.value.__notes__)
    assert session.alive
    assert session.exec(GATHER.format(probe="value")) == [1, 11]


def test_an_interrupt_stops_the_cell_on_every_node_and_keeps_the_state(
    session: Session,
) -> None:
    def waiting() -> None:
        import time

        print("waiting", flush=True)
        time.sleep(600)

    run = session.run_call(waiting, (), {}, session.config)
    while "waiting" not in run.output(1):
        assert not run.ended(0.05), run.outcomes()
    run.stop()
    with pytest.raises(nbddp.RankError, match="stopped"):
        run.wait()
    assert session.alive
    assert session.exec(GATHER.format(probe="value")) == [1, 11]


def test_a_rank_blocked_in_a_collective_across_nodes_is_freed(session: Session) -> None:
    def fail_before_all_reduce() -> None:
        import torch
        import torch.distributed as dist

        if dist.get_rank() == 1:
            raise ValueError("raised on node 1 before the all_reduce")
        dist.all_reduce(torch.ones(1))

    with pytest.raises(ValueError, match="before the all_reduce") as info:
        session.run(fail_before_all_reduce)
    assert "re-initialised" in info.value.__notes__[-1], info.value.__notes__
    assert session.alive
    assert session.exec(GATHER.format(probe="value")) == [1, 11]  # state and a new group


def total_on_every_node(data: object) -> list[float]:
    import torch.distributed as dist

    everyone: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, float(data.sum()))  # type: ignore[attr-defined]
    return everyone  # type: ignore[return-value]


def test_a_tensor_the_nodes_hold_unchanged_is_not_sent_again(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    from nbddp.cluster import client

    shipped: list[tuple[object, ...]] = []
    real = client.ship_payload

    def recording(payload: Payload, held: frozenset[Mark] = frozenset()) -> ShippedPayload:
        out = real(payload, held)
        shipped.append(out[1])  # each memory, or None where the nodes hold it
        return out

    monkeypatch.setattr(client, "ship_payload", recording)
    data = torch.ones(10 << 20)  # 40 MiB
    assert session.run(total_on_every_node, data) == [float(10 << 20)] * 2
    session.exec("between = 1")  # a cell that reads nothing of it
    assert session.run(total_on_every_node, data) == [float(10 << 20)] * 2
    data[0] = 5.0  # changed in the notebook: it goes again
    assert session.run(total_on_every_node, data) == [float(10 << 20) + 4.0] * 2
    assert [len(memory) for memory in shipped] == [1, 0, 1, 1]
    assert shipped[0] != (None,) and shipped[2] == (None,) and shipped[3] != (None,)


def test_a_live_session_holds_its_agents_when_idle_ones_are_handed_back(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NBDDP_CLUSTER_IDLE", "0")
    held = newest()
    nbddp.cluster.release()  # hands back every set no run uses: the session uses this one
    assert nodes.kept() == [held]
    assert session.exec(GATHER.format(probe="value")) == [1, 11]


def test_the_table_says_each_ranks_node_and_the_agents_held(session: Session) -> None:
    table = session.describe()
    assert f"1 {WORKER}" in table, table
    assert "held by 1 run(s), 1 of them session(s)" in table, table


def test_a_rank_killed_on_node_1_ends_the_session_naming_the_rank_and_node(
    session: Session,
) -> None:
    import psutil

    ranks = [psutil.Process(pid) for pid in session.pids.values()]
    with pytest.raises(RankExitedError, match="rank 1 was killed by signal SIGKILL") as info:
        session.exec(
            "import os, signal, time\n"
            "if rank == 1:\n    os.kill(os.getpid(), signal.SIGKILL)\n"
            "time.sleep(600)\n"
        )
    notes = "".join(info.value.__notes__)
    assert f"on node 1 ({WORKER})" in notes, notes
    assert "the ranks' state is lost" in notes
    assert not session.alive
    assert not wait_procs_gone(ranks, timeout=10)


def test_a_killed_notebooks_session_leaves_nothing_on_any_node(cluster: object) -> None:
    nbddp.cluster.release()  # the nodes' CPUs go to the other notebook
    gone = kill_it_and_wait_for_its_ranks(cluster.address, session=True)  # type: ignore[attr-defined]
    print(f"the session's ranks and agents gone {gone:.2f}s after the notebook was killed")
