"""A prompt in the user's hands does not hold the run up: a failure elsewhere ends the
run and the prompt is withdrawn, saying so; the ranks that wait meanwhile write nothing
of their own into their output."""

from __future__ import annotations

import threading
from pathlib import Path

import psutil
import pytest

import nbddp
from nbddp.launcher.logs import read_rank_log
from tests.multiproc import prompt_fns


def test_a_rank_waiting_for_a_peer_at_a_prompt_writes_no_store_warnings() -> None:
    run = nbddp.launch(prompt_fns.ask_then_return, procs=2, init_process_group=True, block=False)

    def asker(rank: int, prompt: str, password: bool) -> str:
        psutil.Process(run.pids[0]).wait(60)  # rank 0 gave up waiting for rank 1 and left
        return "go"

    run.asker = asker
    assert run.wait().values == {0: 0, 1: 1}
    rank0 = read_rank_log(run.log_dir, 0, 2, None)
    assert "c10d" not in rank0, rank0


def test_a_prompt_whose_rank_ended_is_withdrawn(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flag = tmp_path / "asked"
    run = nbddp.launch(
        prompt_fns.ask_or_fail, str(flag), procs=2, init_process_group=True, block=False
    )

    def asker(rank: int, prompt: str, password: bool) -> str:
        flag.touch()  # rank 1 fails now, while the user holds rank 0's prompt ...
        threading.Event().wait()  # ... and never answers it
        raise AssertionError("unreachable")

    run.asker = asker
    with pytest.raises(ValueError, match="rank 1 failed while rank 0 was asked"):
        run.wait()
    said = capsys.readouterr()
    assert (
        "nbddp: [rank 0] no longer asks: it ended, so its prompt takes no answer"
        in said.out + said.err
    )
