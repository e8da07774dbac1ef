"""``%%ddp --cluster`` and ``%ddp_config --cluster`` in a real kernel: the cell runs
on ranks of both nodes, its output and its errors come back as on one machine."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.cluster.conftest import WORKER
from tests.kernel.kernel import Kernel, ok
from tests.procs import wait_gone, wait_procs_gone


@pytest.fixture(scope="module")
def kernel(cluster: object) -> Iterator[Kernel]:
    with Kernel() as k:
        ok(k, "%load_ext nbddp")
        yield k


def test_a_ddp_cell_runs_on_both_nodes(kernel: Kernel, cluster: object) -> None:
    address = cluster.address  # type: ignore[attr-defined]
    result = kernel.execute(
        f"%%ddp --nodes 2 --procs 1 --cluster {address}\n"
        "import os\n"
        "print(f'rank {rank} of {world_size} on node {os.environ[\"NODE_RANK\"]}')\n",
        timeout=180,
    )
    assert result.status == "ok", result.text()
    assert "[rank 0] rank 0 of 2 on node 0\n" in result.rank_output
    assert "[rank 1] rank 1 of 2 on node 1\n" in result.rank_output


def test_the_cluster_set_by_ddp_config_serves_the_cells_and_their_errors(
    kernel: Kernel, cluster: object
) -> None:
    address = cluster.address  # type: ignore[attr-defined]
    result = kernel.execute(f"%ddp_config --nodes 2 --procs 1 --cluster {address}")
    assert result.status == "ok", result.text()
    result = kernel.execute(
        "%%ddp\nif rank == 1:\n    raise LookupError('missing on the second node')\n",
        timeout=180,
    )
    assert result.status == "error", result.text()
    assert result.error is not None
    assert result.error["ename"] == "LookupError"
    shown = "\n".join(result.error["traceback"])
    assert "missing on the second node" in shown
    assert "raised on rank 1 of 2" in shown


def test_an_interrupt_ends_every_rank_on_every_node(kernel: Kernel, cluster: object) -> None:
    address = cluster.address  # type: ignore[attr-defined]
    msg_id = kernel.kc.execute(
        f"%%ddp --nodes 2 --procs 1 --cluster {address}\n"
        "import time\nprint('sleeping', flush=True)\ntime.sleep(600)\n"
    )
    kernel.wait_for_output(msg_id, "sleeping", timeout=120)
    interrupted = time.monotonic()
    kernel.interrupt()
    result = kernel.collect(msg_id, timeout=60)
    assert result.status == "error", result.text()
    assert result.error is not None and result.error["ename"] == "KeyboardInterrupt"
    assert time.monotonic() - interrupted < 15
    assert not wait_gone(timeout=10.0)


def test_a_session_across_nodes_keeps_state_from_cell_to_cell(
    kernel: Kernel, cluster: object
) -> None:
    address = cluster.address  # type: ignore[attr-defined]
    result = kernel.execute(f"%ddp_session start --nodes 2 --procs 1 --cluster {address}", 180)
    assert result.status == "ok", result.text()
    assert f"1 {WORKER}" in result.text(), result.text()  # the table names each rank's node
    result = kernel.execute(
        "%%ddp\nimport os\nwhere = f\"{rank} on node {os.environ['NODE_RANK']}\"\n"
    )
    assert result.status == "ok", result.text()
    result = kernel.execute("%%ddp\nprint(where)\n")
    assert result.status == "ok", result.text()
    assert "[rank 0] 0 on node 0\n" in result.rank_output
    assert "[rank 1] 1 on node 1\n" in result.rank_output
    result = kernel.execute("%ddp_session stop")
    assert result.status == "ok", result.text()
    assert not wait_gone(timeout=10.0)


def test_a_killed_kernel_with_a_session_across_nodes_leaves_nothing(cluster: object) -> None:
    import psutil

    address = cluster.address  # type: ignore[attr-defined]
    with Kernel() as doomed:
        for code in (
            "%load_ext nbddp",
            f"%ddp_session start --nodes 2 --procs 1 --cluster {address}",
        ):
            result = doomed.execute(code, 180)
            assert result.status == "ok", result.text()
        result = doomed.execute("%%ddp\nimport os\ntotal = rank\nprint('PID', os.getpid())\n")
        assert result.status == "ok", result.text()
        ranks = [int(line.split()[-1]) for line in result.rank_output.splitlines() if "PID" in line]
        result = doomed.execute(
            "from nbddp.cluster import agents\nprint(*(i.pid for i in agents.kept()[-1].infos))"
        )
        assert result.status == "ok", result.text()
        agents = [int(pid) for pid in result.stdout.split()]
        assert len(ranks) == 2 and len(agents) == 2, (ranks, agents)
        left = [psutil.Process(pid) for pid in ranks + agents]
        doomed.kill()
        assert not wait_procs_gone(left, timeout=30), "alive 30 s after the kernel was killed"
