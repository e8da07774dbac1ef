"""Why a Slurm node's agent is gone, in Slurm's own words, whatever order srun says them in."""

from __future__ import annotations

import os
import threading
from typing import IO

from nbddp.cluster.slurm_engine import SlurmEngine

CANCELLED = (
    "srun: error: STEP 261.5 ON n1 CANCELLED AT 2026-11-27T18:14:41 DUE TO NODE FAILURE, "
    "SEE SLURMCTLD LOG FOR DETAILS\n"
)
LOST = "srun: error: Node failure on n2\n"


class Step:
    """srun's process as the engine follows it: its stderr, then its exit."""

    def __init__(self, stderr: IO[str]) -> None:
        self.stderr, self.returncode = stderr, None

    def wait(self, timeout: float | None = None) -> int:
        self.returncode = 1
        return 1


class Agent:
    """A caller as the engine closes it, with the reason it is given."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.why: list[str] = []
        self.closed = threading.Event()

    def close(self, why: str) -> None:
        self.why.append(why)
        self.closed.set()


def test_the_lost_node_is_named_by_slurms_line_about_it_when_another_came_first() -> None:
    read, write = os.pipe()
    with os.fdopen(read) as stderr, os.fdopen(write, "w") as said:
        engine = SlurmEngine("261", Step(stderr), None)  # type: ignore[arg-type]
        lost = Agent("n2 (127.0.0.1)")
        engine.callers[1] = lost  # type: ignore[assignment]
        # Under load srun may say first what the lost node did to the other node's task.
        said.write(CANCELLED + LOST)
        said.flush()
        assert lost.closed.wait(10)
    assert lost.why[0] == "Slurm: Node failure on n2"
    assert engine.gone(lost) == "Slurm: Node failure on n2"  # type: ignore[arg-type]


def test_a_task_cancelled_for_another_nodes_failure_is_not_its_own_nodes_loss() -> None:
    read, write = os.pipe()
    with os.fdopen(read) as stderr, os.fdopen(write, "w") as said:
        engine = SlurmEngine("261", Step(stderr), None)  # type: ignore[arg-type]
        said.write(CANCELLED)
        said.flush()
        with engine._heard:
            assert engine._heard.wait_for(lambda: bool(engine._said), 10)
        # n1's agent goes with its cancelled task: its loss waits for Slurm's word on n2.
        assert engine._about("n1") is None
