"""Prompts without processes: the rank's side (a fake link), the notebook's wording,
and the clock that leaves time at a prompt out of a timeout."""

from __future__ import annotations

import builtins
import getpass
import sys
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from nbddp.launcher.prompts import WaitClock, ask_rank, ask_user, prompt_for
from nbddp.rank import prompt
from nbddp.wire.protocol import NO_STDIN, InputAnswer, InputRequest


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
    saved = builtins.input, sys.stdin, getpass.getpass
    link = _Link(answers)
    prompt.install(link)  # type: ignore[arg-type]
    try:
        yield answers
    finally:
        builtins.input, sys.stdin, getpass.getpass = saved
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


def test_getpass_in_a_rank_asks_for_a_password_with_its_prompt_and_echoes_no_secret(
    rank_link: list[InputAnswer], capsys: pytest.CaptureFixture[str]
) -> None:
    rank_link.extend([InputAnswer(1, "s3cret"), InputAnswer(2, "pin")])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no GetPassWarning
        assert getpass.getpass() == "s3cret"
        assert getpass.getpass("PIN: ") == "pin"
    sent = prompt._ASKING.channel.sent  # type: ignore[union-attr]
    assert sent == [
        ("input", InputRequest(1, "Password: ", password=True)),
        ("input", InputRequest(2, "PIN: ", password=True)),
    ]
    assert capsys.readouterr() == ("Password: \nPIN: \n", "")


def test_threads_asking_at_once_each_get_their_own_answer(
    rank_link: list[InputAnswer],
) -> None:
    class HeldLink:
        """Answers once every thread has asked, the last asked first."""

        def __init__(self, count: int) -> None:
            self.requests: list[InputRequest] = []
            self.count = count
            self.lock = threading.Lock()

        def send(self, kind: str, body: InputRequest) -> None:
            with self.lock:
                self.requests.append(body)
                if len(self.requests) < self.count:
                    return
            for request in reversed(self.requests):
                prompt.answer(InputAnswer(request.number, f"for {request.prompt}"))

    assert prompt._ASKING is not None
    prompt._ASKING.channel = HeldLink(4)  # type: ignore[assignment]
    got: dict[str, str] = {}

    def ask(name: str) -> None:
        got[name] = input(name)

    threads = [threading.Thread(target=ask, args=(f"t{i}",), daemon=True) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert got == {f"t{i}": f"for t{i}" for i in range(4)}


def test_a_frontend_without_stdin_is_said_in_the_ranks_error(
    rank_link: list[InputAnswer],
) -> None:
    rank_link.append(InputAnswer(1, NO_STDIN))
    with pytest.raises(prompt.NoStdinError) as raised:
        input("who? ")
    message = str(raised.value)
    assert "\n" not in message, message
    assert "not available in this frontend" in message, message
    assert "%ddp_debug" in message and "JupyterLab" in message, message
    rank_link.append(InputAnswer(2, None))  # plain end of input is still EOFError
    with pytest.raises(EOFError) as eof:
        input()
    assert str(eof.value) == ""


def test_the_notebook_tells_end_of_input_from_a_frontend_without_stdin(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_stdin(prompt: str = "") -> str:
        # IPython's StdinNotImplementedError is a NotImplementedError.
        raise NotImplementedError("the frontend does not support input requests")

    monkeypatch.setattr(builtins, "input", no_stdin)
    assert ask_user("who? [rank 0] ") is NO_STDIN
    monkeypatch.setattr(builtins, "input", lambda prompt="": (_ for _ in ()).throw(EOFError))
    assert ask_user("who? [rank 0] ") is None


def test_a_password_is_asked_with_getpass_naming_the_rank(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[str] = []
    monkeypatch.setattr(getpass, "getpass", lambda prompt="": asked.append(prompt) or "pw")
    monkeypatch.setattr(builtins, "input", lambda prompt="": pytest.fail("input() asked"))
    assert ask_rank(1, "Password: ", True) == "pw"
    assert asked == ["Password: [rank 1] "]


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
