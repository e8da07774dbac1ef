"""A run's logs and how it reads at a glance: ``Run.log``, ``last_lines``, ``repr(run)``."""

from __future__ import annotations

from pathlib import Path

import pytest

from nbddp.launcher.config import JobSpec, LaunchConfig
from nbddp.launcher.events import RankOutcome, RankState, RunStatus
from nbddp.launcher.logs import last_lines
from nbddp.launcher.run import Run


@pytest.mark.parametrize(
    ("text", "count", "expected"),
    [
        (b"a\nb\nc\n", 2, b"b\nc\n"),
        (b"a\nb\nc", 2, b"b\nc"),
        (b"a\nb\n", 5, b"a\nb\n"),
        (b"a\nb\n", 0, b""),
        (b"", 3, b""),
    ],
)
def test_last_lines(tmp_path: Path, text: bytes, count: int, expected: bytes) -> None:
    path = tmp_path / "log"
    path.write_bytes(text)
    assert last_lines(path, count) == expected


def test_last_lines_reads_across_blocks(tmp_path: Path) -> None:
    path = tmp_path / "log"
    path.write_bytes(b"".join(f"line {i}\n".encode() for i in range(1000)))
    assert last_lines(path, 3, block=16) == b"line 997\nline 998\nline 999\n"


class Source:
    """What ``Run``'s repr and ``log`` read of a job."""

    def __init__(self, log_dir: Path, status: RunStatus, states: list[RankState]) -> None:
        self.log_dir = log_dir
        self.run_id = "r1"
        self.status = status
        self.root_cause = None
        self.ranks = [
            RankOutcome(r, s, 100 + r, None, False, None, None, 0.0, None)
            for r, s in enumerate(states)
        ]

    def outcomes(self) -> tuple[RankOutcome, ...]:
        return tuple(self.ranks)

    def elapsed(self) -> float:
        return 83.4


def make_run(tmp_path: Path, status: RunStatus, states: list[RankState]) -> Run:
    config = LaunchConfig(JobSpec(world_size=len(states), device="cpu"))
    return Run(Source(tmp_path, status, states), None, config)  # type: ignore[arg-type]


def test_a_runs_repr_says_its_state_ranks_and_elapsed_time(tmp_path: Path) -> None:
    run = make_run(tmp_path, RunStatus.RUNNING, [RankState.RUNNING, RankState.WAITING])
    assert repr(run) == "<nbddp Run r1: running, 2 ranks (1 running, 1 waiting for input), 1m23s>"
    shown = run._repr_html_()
    assert "running" in shown and "1m23s" in shown and "waiting for input" in shown
    assert "<script" not in shown


def test_log_names_the_ranks_there_are(tmp_path: Path) -> None:
    run = make_run(tmp_path, RunStatus.DONE, [RankState.DONE, RankState.DONE])
    with pytest.raises(ValueError, match=r"rank=2: this run's ranks are 0 to 1"):
        run.log(2)
    with pytest.raises(ValueError, match=r"tail=-1"):
        run.log(0, tail=-1)
    assert run.log(1) == ""  # nothing written yet
