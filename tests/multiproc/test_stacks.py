"""Stack dumps: the user's frames first, each rank's dump whole, whatever the code does.

Each test also gets the leftover-process check (tests/conftest.py).
"""

from __future__ import annotations

import pytest

import nbddp
from tests.displays import Recorder
from tests.multiproc import fns


def _timed_out(fn: object, seconds: float) -> tuple[nbddp.Run, Recorder, str]:
    run = nbddp.launch(fn, procs=2, timeout=seconds, block=False, output="none")
    run.display = recorder = Recorder()
    with pytest.raises(nbddp.LaunchTimeout) as info:
        run.wait()
    return run, recorder, str(info.value)


def _dumps(recorder: Recorder) -> dict[int, list[str]]:
    found: dict[int, list[str]] = {0: [], 1: []}
    for rank, text in recorder.chunks:
        if "stacks, most recent call last" in text:
            found[rank].append(text)
    return found


def test_a_timeout_shows_each_ranks_user_frames_first_in_one_piece() -> None:
    run, recorder, message = _timed_out(fns.stuck_in_user_code, 3)
    dumps = _dumps(recorder)
    for rank in (0, 1):
        assert len(dumps[rank]) == 1, recorder.chunks  # one chunk: never interleaved
        dump = dumps[rank][0]
        assert dump.startswith(f"nbddp: rank {rank} (pid ")
        threads = [line for line in dump.splitlines() if line.startswith("Thread ")]
        assert threads[0] == "Thread 'MainThread':"  # where the user's function runs
        assert "Thread 'user-helper':" in threads
        main = dump.split("Thread 'MainThread':\n")[1].split("Thread ")[0]
        # The first frame shown is the user's function, not the launcher's.
        assert main.lstrip().startswith('File "') and "in stuck_in_user_code" in main.split("\n")[0]
        assert "in _stuck_inner" in main
        assert "nbddp/rank/" not in dump and "nbddp/launcher/" not in dump
        assert "(nbddp's own threads, not shown: nbddp-link)" in dump
        assert dump in run.output(rank)  # the log has it too
    assert "the stacks of ranks 0, 1 are in the output" in message


def test_stacks_are_taken_when_the_users_code_owns_sigusr1() -> None:
    _run, recorder, message = _timed_out(fns.stuck_with_own_sigusr1, 2)
    dumps = _dumps(recorder)
    assert all(len(dumps[rank]) == 1 and "in _stuck_inner" in dumps[rank][0] for rank in (0, 1))
    assert not any("user's SIGUSR1 handler ran" in text for _, text in recorder.chunks)
    assert "the stacks of ranks 0, 1 are in the output" in message


def test_a_rank_holding_the_gil_gets_a_c_level_dump_and_the_error_says_so() -> None:
    run, recorder, message = _timed_out(fns.stuck_holding_the_gil, 2)
    assert any("did not answer for its stacks" in n for n in recorder.notices)
    assert "ranks 0, 1 did not answer (a thread held the GIL)" in message
    for rank in (0, 1):
        log = run.output(rank)
        assert "Current thread" in log or "Thread 0x" in log  # faulthandler's own format
        assert "in stuck_holding_the_gil" in log
