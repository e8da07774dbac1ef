"""The engine interface alone: a cluster run, a session and a lost node over agents that an
engine of a few lines places in this process (no Ray), each node's ranks real processes.

What a new engine supplies is what ``InProcess`` and ``Direct`` are here: placement and a
channel. Everything else (the run core, the cells, the agents' runs, failures, lost nodes,
idle hand-back) is the engine-neutral code under test."""

from __future__ import annotations

import concurrent.futures
import os
import threading
from collections.abc import Iterator

import pytest

import nbddp
from nbddp.agent.node import NodeAgent
from nbddp.cluster import agents as kept
from nbddp.cluster import ray_engine
from nbddp.cluster.agents import Agents, Channel, Engine, Shape
from nbddp.errors import RankExitedError
from nbddp.launcher.config import LaunchConfig
from nbddp.launcher.events import RunStatus

ADDRESS = "127.0.0.1"


class LocalAgent(NodeAgent):
    """An agent in this process: its node is this machine, and it never ends the process."""

    def node_address(self) -> str:
        return ADDRESS

    def _watch(self) -> None:
        """No watchdog: it would end this process once the polls stop."""

    def _keep_alive(self, seconds: float) -> None:
        """Likewise."""


class Direct:
    """A channel that calls the agent's method on a thread of a pool, as Ray's actor does."""

    def __init__(self, agent: NodeAgent, pool: concurrent.futures.Executor) -> None:
        self.agent, self.pool, self.lost = agent, pool, False

    def call(self, method: str, *args: object) -> concurrent.futures.Future[object]:
        if self.lost:
            raise ConnectionError("the agent is gone")
        future = self.pool.submit(getattr(self.agent, method), *args)
        future.result = _with_timeout(future.result)  # type: ignore[method-assign]
        return future


def _with_timeout(result: object) -> object:
    def wait(timeout: float) -> object:
        return result(timeout)  # type: ignore[operator]

    return wait


class InProcess(Engine):
    """The engine: values are shared as they are; giving back ends the agents' runs."""

    def __init__(self) -> None:
        self.given_back = 0

    def give_back(self, hold: object, channels: list[Channel]) -> None:
        self.given_back += 1
        for channel in channels:
            assert isinstance(channel, Direct)
            for run in list(channel.agent._runs):
                channel.agent.stop(run, RunStatus.STOPPED)


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> Iterator[InProcess]:
    """Two in-process agents, placed by ``InProcess`` for every cluster run of the test."""
    engine = InProcess()
    pool = concurrent.futures.ThreadPoolExecutor(32)
    placed: list[Agents] = []

    def place(config: LaunchConfig) -> Agents:
        shape: Shape = ("in-process", config.nodes, 0, 1)
        reused = kept.reuse(shape)
        if reused is not None:
            return reused
        channels: list[Channel] = [Direct(LocalAgent(), pool) for _ in range(config.nodes)]
        infos = [c.agent.describe() for c in channels if isinstance(c, Direct)]
        placed.append(kept.keep(Agents(shape, engine, None, channels, infos)))
        return placed[-1]

    monkeypatch.setattr(ray_engine, "place", place)
    before = set(threading.enumerate())
    yield engine
    kept.release_agents(everything=True)
    pool.shutdown(wait=True)  # every call made, a run's last (close_store) included
    stores = [c.agent._stores for a in placed for c in a.channels if isinstance(c, Direct)]
    assert not any(stores), f"rendezvous stores left on the agents: {stores}"
    # Nothing of the agents' is left in this process: their followers end with them.
    for thread in set(threading.enumerate()) - before:
        if thread.name.startswith(("nbddp-node", "nbddp-agent")):
            thread.join(10.0)
    left = [
        t.name for t in threading.enumerate() if t.name.startswith(("nbddp-node", "nbddp-agent"))
    ]
    assert not left, f"threads left: {left}"


def _rank_and_world() -> tuple[int, int, str]:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    return int(os.environ["RANK"]), int(t.item()), os.environ["NODE_RANK"]


def _fails_on_rank_3() -> None:
    if os.environ["RANK"] == "3":
        raise KeyError("rank 3's own error")
    import time

    time.sleep(60)  # stopped after the failure's grace


def _sleeps() -> None:
    import time

    time.sleep(60)


def test_a_run_over_an_engine_of_placement_and_a_channel(engine: InProcess) -> None:
    run = nbddp.launch(_rank_and_world, nodes=2, procs=2, cluster="ray://x:1", block=False)
    result = run.wait()
    assert result.values[0] == (0, 4, "0")  # a 4-rank all_reduce across both "nodes"
    assert run.status == "done"
    nxt = nbddp.launch(_rank_and_world, nodes=2, procs=2, cluster="ray://x:1")
    assert nxt == (0, 4, "0")  # the same agents, kept (one set placed)
    assert len(kept.kept()) == 1 and engine.given_back == 0


def test_a_failing_rank_on_one_node_raises_its_own_error_and_stops_the_other(
    engine: InProcess,
) -> None:
    with pytest.raises(KeyError, match="rank 3's own error"):
        nbddp.launch(_fails_on_rank_3, nodes=2, procs=2, cluster="ray://x:1", output="none")


def test_a_session_keeps_its_state_across_cells_on_both_nodes(engine: InProcess) -> None:
    session = nbddp.session(nodes=2, procs=2, cluster="ray://x:1")
    try:
        assert session.exec("import os\nmine = int(os.environ['RANK']) * 10\nmine") == 0
        assert session.exec("mine + 1") == 1  # the same ranks, their state kept
        assert session.exec("import torch.distributed as dist\ndist.get_world_size()") == 4
    finally:
        session.stop()


def test_a_lost_node_ends_the_run_naming_it(engine: InProcess) -> None:
    run = nbddp.launch(_sleeps, nodes=2, procs=2, cluster="ray://x:1", block=False)
    agents = kept.kept()[-1]
    channel = agents.channels[1]
    assert isinstance(channel, Direct)
    channel.lost = True  # node 1 no longer answers: its follower reports it lost
    lost = r"rank 2 ended with the loss of node 1 \(127.0.0.1\), which ran ranks 2, 3"
    with pytest.raises(RankExitedError, match=lost):
        run.wait()
    assert run.rank_states() == {0: "stopped", 1: "stopped", 2: "failed", 3: "failed"}
    for name in list(channel.agent._runs):  # the lost node's ranks, still here: end them
        channel.agent.stop(name, RunStatus.STOPPED)
