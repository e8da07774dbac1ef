"""Reading from the user in a rank: ``input()``, ``breakpoint()``, ``sys.stdin``, post-mortem.

``install(channel)`` makes ``input`` and ``sys.stdin`` ask the notebook: a read flushes output,
sends an ``InputRequest`` and blocks until the link thread hands over the matching answer
(``answer``; None is end of input), then echoes prompt and line as a terminal would. pdb reads
through ``input``. ``post_mortem(tb)`` opens pdb where ``tb`` raised. Nothing runs until a read;
a process forked from the rank reads end of input (only the rank speaks on its link).
"""

from __future__ import annotations

import builtins
import io
import os
import queue
import sys
from dataclasses import dataclass
from types import TracebackType

from nbddp import prctl
from nbddp.rank.channel import Channel
from nbddp.wire.protocol import InputAnswer, InputRequest


@dataclass
class _Asking:
    channel: Channel
    answers: queue.SimpleQueue[InputAnswer]
    pid: int
    asked: int = 0


_ASKING: _Asking | None = None


def install(channel: Channel) -> None:
    """Route this rank's ``input()`` and ``sys.stdin`` to the notebook (see contract)."""
    global _ASKING
    _ASKING = _Asking(channel, queue.SimpleQueue(), os.getpid())
    builtins.input = ask_input
    sys.stdin = NotebookStdin()
    # ray.init() points PYTHONBREAKPOINT at Ray's debugger, which works only in
    # Ray's own processes; a rank that inherited it uses pdb, which asks here.
    if os.environ.get("PYTHONBREAKPOINT", "").startswith("ray."):
        del os.environ["PYTHONBREAKPOINT"]


def answer(body: object) -> None:
    """Take an ``InputAnswer`` the link thread received."""
    if _ASKING is not None and isinstance(body, InputAnswer):
        _ASKING.answers.put(body)


def ask(prompt: str) -> str | None:
    """One line from the user for ``prompt``; None at the end of input."""
    asking = _ASKING
    if asking is None or asking.pid != os.getpid():
        return None
    prctl.flush_output()  # what the rank printed before the prompt is shown before it
    asking.asked += 1
    number = asking.asked
    asking.channel.send("input", InputRequest(number, prompt))
    while True:
        try:
            reply = asking.answers.get()
        except KeyboardInterrupt:
            # pdb takes a KeyboardInterrupt at its prompt and asks again; an
            # interrupt from the notebook must end the cell instead.
            raise PromptInterrupted from None
        # An answer for an earlier request (one an interrupt abandoned) is stale.
        if reply.number == number:
            return reply.text


class PromptInterrupted(BaseException):
    """The notebook interrupted a rank waiting at a prompt (a ``KeyboardInterrupt``
    that pdb does not catch)."""


def ask_input(prompt: object = "") -> str:
    """``input()`` in a rank: asks the notebook."""
    text = str(prompt)
    line = ask(text)
    if line is None:
        raise EOFError
    sys.stdout.write(f"{text}{line}\n")
    return line


class NotebookStdin(io.TextIOBase):
    """``sys.stdin`` in a rank: each line read is asked of the user."""

    def readable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    # typeshed gives TextIOBase the readline of bytes streams.
    def readline(self, size: int | None = -1, /) -> str:  # type: ignore[override]
        line = ask("")
        return "" if line is None else f"{line}\n"

    def read(self, size: int | None = -1, /) -> str:
        if size is not None and size >= 0:
            return self.readline()
        lines = []
        while line := self.readline():
            lines.append(line)
        return "".join(lines)


def post_mortem(tb: TracebackType | None) -> None:
    """pdb on the frame that raised; ``q`` or ``c`` leave it."""
    import pdb

    if tb is None:
        return
    debugger = pdb.Pdb()
    debugger.reset()
    debugger.interaction(None, tb)
    prctl.flush_output()
