"""Prompts without processes: the rank's side (a fake link), the notebook's wording,
and the clock that leaves time at a prompt out of a timeout."""

from __future__ import annotations

import builtins
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from nbddp.launcher.pump import WaitClock, ask_user, prompt_for
from nbddp.rank import prompt
from nbddp.wire.protocol import InputAnswer, InputRequest


class _Link:
    """Stands for a rank's channel: records what is sent; answers from a thread."""

    def __init__(self, answers: list[InputAnswer]) -> None:
        self.sent: list[tuple[str, Any]] = []
        self._answers = answers

    def send(self, kind: str, body: Any) -> None:
        self.sent.append((kind, body))
        reply = self._answers.pop(0)
        threading.Thread(target=prompt.answer, args=(reply,)).start()


@pytest.fixture
def rank_link() -> Iterator[list[InputAnswer]]:
    answers: list[InputAnswer] = []
    saved = builtins.input, sys.stdin
    link = _Link(answers)
    prompt.install(link)  # type: ignore[arg-type]
    try:
        yield answers
    finally:
        builtins.input, sys.stdin = saved
        prompt._ASKING = None


def test_input_in_a_rank_asks_the_notebook_and_echoes_the_line(
    rank_link: list[InputAnswer], capsys: pytest.CaptureFixture[str]
) -> None:
    rank_link.append(InputAnswer(1, "ada"))
    assert input("who? ") == "ada"
    assert prompt._ASKING is not None
    assert prompt._ASKING.channel.sent == [("input", InputRequest(1, "who? "))]  # type: ignore[attr-defined]
    assert capsys.readouterr().out == "who? ada\n"


def test_a_stale_answer_is_dropped_and_none_is_end_of_input(
    rank_link: list[InputAnswer],
) -> None:
    prompt.answer(InputAnswer(7, "for a prompt an interrupt abandoned"))
    rank_link.append(InputAnswer(1, None))
    with pytest.raises(EOFError):
        input()
    rank_link.extend([InputAnswer(2, "line"), InputAnswer(3, None)])
    assert sys.stdin.read() == "line\n"


def test_the_prompt_names_the_rank() -> None:
    assert prompt_for(1, "(Pdb) ") == "(Pdb) [rank 1] "
    assert prompt_for(0, "") == "[rank 0] "


def test_with_nobody_to_answer_the_rank_reads_end_of_input(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_stdin(prompt: str = "") -> str:
        raise NotImplementedError("the frontend does not support input requests")

    monkeypatch.setattr(builtins, "input", no_stdin)
    assert ask_user("who? [rank 0] ") is None
    monkeypatch.setattr(builtins, "input", lambda prompt="": (_ for _ in ()).throw(EOFError))
    assert ask_user("who? [rank 0] ") is None


def test_the_wait_clock_owes_the_time_ranks_spent_at_a_prompt() -> None:
    now = [100.0]
    clock = WaitClock(lambda: now[0])
    assert clock.owed() == 0.0
    clock.begin(0)
    now[0] += 2.0
    clock.begin(1)  # overlapping waits count once
    now[0] += 3.0
    clock.end(0)
    assert clock.owed() == 5.0 and clock.waiting == {1}  # the current wait so far
    now[0] += 1.0
    clock.end(1)
    now[0] += 10.0  # nobody waits: not owed
    assert clock.owed() == 1.0
    assert clock.owed() == 0.0
