"""Reading from the user in a rank: ``input()``, ``getpass``, ``breakpoint()``, ``sys.stdin``.

``install(channel)`` makes ``input``, ``getpass.getpass`` and ``sys.stdin`` ask the notebook: a
read flushes output, sends an ``InputRequest`` and blocks until the link thread hands over the
answer with its number (``answer``; threads wait for their own), then echoes prompt and line as a
terminal would (a password: the prompt). None is end of input; ``NO_STDIN`` raises ``NoStdinError``.
pdb reads through ``input``. ``post_mortem(tb)`` opens pdb where ``tb`` raised. Nothing runs
until a read; a process forked from the rank reads end of input (only the rank speaks on its link).
"""

from __future__ import annotations

import builtins
import getpass
import io
import itertools
import os
import queue
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import TextIO

from nbddp import prctl
from nbddp.rank.channel import Channel
from nbddp.wire.protocol import NO_STDIN, InputAnswer, InputRequest

NO_STDIN_MESSAGE = (
    "input is not available in this frontend (it cannot answer a rank's input(), getpass() or "
    "pdb); use %ddp_debug after the run (post-mortem, in a session) or a frontend that "
    "supports stdin, such as JupyterLab"
)


@dataclass
class _Asking:
    channel: Channel
    pid: int
    # Request number -> where its answer goes, while its thread waits. Why no lock:
    # next() on a count and one dict operation each are atomic under the GIL.
    waiting: dict[int, queue.SimpleQueue[InputAnswer]] = field(default_factory=dict)
    numbers: Iterator[int] = field(default_factory=lambda: itertools.count(1))


_ASKING: _Asking | None = None


def install(channel: Channel) -> None:
    """Route this rank's ``input()`` and ``sys.stdin`` to the notebook (see contract)."""
    global _ASKING
    _ASKING = _Asking(channel, os.getpid())
    builtins.input = ask_input
    getpass.getpass = ask_password
    sys.stdin = NotebookStdin()
    # ray.init() points PYTHONBREAKPOINT at Ray's debugger, which works only in
    # Ray's own processes; a rank that inherited it uses pdb, which asks here.
    if os.environ.get("PYTHONBREAKPOINT", "").startswith("ray."):
        del os.environ["PYTHONBREAKPOINT"]


def answer(body: object) -> None:
    """Take an ``InputAnswer`` the link thread received."""
    if _ASKING is not None and isinstance(body, InputAnswer):
        slot = _ASKING.waiting.get(body.number)
        if slot is not None:  # else nobody waits for it any more (an interrupt abandoned it)
            slot.put(body)


def ask(prompt: str, password: bool = False) -> str | None:
    """One line from the user for ``prompt``; None at the end of input."""
    asking = _ASKING
    if asking is None or asking.pid != os.getpid():
        return None
    prctl.flush_output()  # what the rank printed before the prompt is shown before it
    number, slot = next(asking.numbers), queue.SimpleQueue[InputAnswer]()
    asking.waiting[number] = slot
    try:
        asking.channel.send("input", InputRequest(number, prompt, password))
        reply = slot.get()
    except KeyboardInterrupt:
        # pdb takes a KeyboardInterrupt at its prompt and asks again; an
        # interrupt from the notebook must end the cell instead.
        raise PromptInterrupted from None
    finally:
        del asking.waiting[number]
    if reply.text is NO_STDIN:
        raise NoStdinError(NO_STDIN_MESSAGE)
    return reply.text


class NoStdinError(NotImplementedError):
    """The notebook's frontend takes no input (as IPython's ``StdinNotImplementedError``):
    not an ``EOFError``, which pdb would take as "quit" and hide."""


class PromptInterrupted(BaseException):
    """The notebook interrupted a rank waiting at a prompt (a ``KeyboardInterrupt``
    that pdb does not catch)."""


def ask_input(prompt: object = "") -> str:
    """``input()`` in a rank: asks the notebook."""
    return _line(str(prompt), password=False)


def ask_password(prompt: str = "Password: ", stream: TextIO | None = None) -> str:
    """``getpass.getpass()`` in a rank: asks the notebook for a password."""
    return _line(prompt, password=True)


def _line(prompt: str, password: bool) -> str:
    line = ask(prompt, password)
    if line is None:
        raise EOFError
    sys.stdout.write(f"{prompt}\n" if password else f"{prompt}{line}\n")
    return line


class NotebookStdin(io.TextIOBase):
    """``sys.stdin`` in a rank: each line read is asked of the user."""

    def readable(self) -> bool:
        return True

    # typeshed gives TextIOBase the readline of bytes streams.
    def readline(self, size: int | None = -1, /) -> str:  # type: ignore[override]
        line = ask("")
        return "" if line is None else f"{line}\n"

    def read(self, size: int | None = -1, /) -> str:
        if size is not None and size >= 0:
            return self.readline()
        return "".join(iter(self.readline, ""))  # every line, to the end of input


def post_mortem(tb: TracebackType | None) -> None:
    """pdb on the frame that raised; ``q`` or ``c`` leave it. Where the frontend takes no
    input, one line on stderr says so instead."""
    import pdb

    if tb is None:
        return
    debugger = pdb.Pdb()
    debugger.reset()
    try:
        debugger.interaction(None, tb)
    except NoStdinError as exc:  # the error the rank raised is what the notebook shows
        print(f"nbddp: no debugger: {exc}", file=sys.stderr)
    prctl.flush_output()
