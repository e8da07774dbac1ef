"""Every error line the pages quote (in their ``text`` blocks, ``ClassName: message``)
is what nbddp raises for it: ``PRODUCERS`` maps each quoted line, by a part of it, to a
call that raises it; the test makes the call and compares the exception's class (the
quoted one, or a subclass) and message, with ``<...>`` in the page standing for any
text. A quoted line without a producer fails, so a new quote needs its call here.
"""

from __future__ import annotations

import re
import socket
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

import nbddp
from nbddp import errors
from tests.docs import error_fns as fns
from tests.docs.pages import PAGES, ROOT

QUOTED_ERROR = re.compile(r"^([A-Z]\w*(?:Error|Timeout)): (.+)$")
TEXT_BLOCK = re.compile(r"^```text\n(.*?)^```", re.M | re.S)


def quoted() -> list[tuple[str, str, str]]:
    """(page, class name, message) of every error line the pages quote in text blocks."""
    found = []
    for page in PAGES:
        for block in TEXT_BLOCK.findall(page.read_text()):
            for line in block.splitlines():
                if m := QUOTED_ERROR.match(line):
                    found.append((str(page.relative_to(ROOT)), m.group(1), m.group(2)))
    return found


def uses_conn_from_a_notebook() -> Callable[[], object]:
    """A function that reads a global connection, defined as a notebook defines it (its
    module is not importable, so it travels by value)."""
    namespace: dict[str, object] = {"__name__": "notebook", "sqlite3": sqlite3}
    exec("conn = sqlite3.connect(':memory:')\ndef uses_conn():\n    return conn\n", namespace)
    return namespace["uses_conn"]  # type: ignore[return-value]


def bad_magic_line() -> None:
    from nbddp.notebook.magics import DdpMagics, parse

    parse(DdpMagics.ddp, "--nprocs 2", "%%ddp")


def busy_port() -> None:
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            taken.bind(("127.0.0.1", 29500))
            taken.listen()
        except OSError:
            pass  # taken already: by someone else, which is as good
        nbddp.launch(fns.returns, procs=2, port=29500)


def versions_differ() -> None:
    from nbddp.wire.versions import mismatch

    ours = {"python": "3.11", "torch": "2.13.0"}
    raise errors.ConfigError(mismatch(ours, {**ours, "torch": "2.8.0"}, "1 (10.0.0.3)") or "")


def fork_after_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """A notebook that initialised CUDA on one GPU (torch's answers, as CUDA gives them)."""
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    nbddp.launch(fns.returns, gpus=1, start_method="fork")


def no_gpu() -> None:
    if Path("/proc/driver/nvidia/gpus").exists():
        pytest.skip("this machine has GPUs: the message is for one without")
    nbddp.launch(fns.returns, gpus=4)


def ray_unreachable() -> None:
    pytest.importorskip("ray")
    nbddp.launch(fns.returns, nodes=2, procs=1, cluster="ray://head:10001")


# A part of the quoted line -> the call that raises it.
PRODUCERS: dict[str, Callable[[pytest.MonkeyPatch], object]] = {
    "unrecognized arguments: --nprocs 2": lambda mp: bad_magic_line(),
    "procs must be at least 1": lambda mp: nbddp.launch(fns.returns, procs=0),
    "unknown start_method 'frok'": lambda mp: nbddp.launch(
        fns.returns, procs=2, start_method="frok"
    ),
    "timeout must be positive": lambda mp: nbddp.launch(fns.returns, procs=2, timeout=-1),
    "nbddp sets MASTER_PORT itself": lambda mp: nbddp.launch(
        fns.returns, procs=2, env={"MASTER_PORT": "1"}
    ),
    "cannot send uses_conn": lambda mp: nbddp.launch(uses_conn_from_a_notebook(), procs=2),
    "train() got an unexpected keyword argument 'nprocs'": lambda mp: nbddp.launch(
        fns.train, procs=2, nprocs=2
    ),
    "port 29500 on 127.0.0.1 is in use": lambda mp: busy_port(),
    "cannot reach the Ray cluster": lambda mp: ray_unreachable(),
    "has different versions than this notebook": lambda mp: versions_differ(),
    "asked for 4 GPUs but none is visible": lambda mp: no_gpu(),
    "start_method='fork' cannot start GPU ranks": fork_after_cuda,
    "rank 1 was killed by signal SIGKILL": lambda mp: nbddp.launch(fns.killed_on_rank_1, procs=2),
    "rank 0 ended with exit code 3": lambda mp: nbddp.launch(fns.exits_3_on_rank_0, procs=2),
    "return value (<type>) cannot be rebuilt": lambda mp: nbddp.launch(
        fns.returns_unrebuildable, procs=2
    ),
    "the run exceeded its timeout": lambda mp: nbddp.launch(fns.runs_long, procs=2, timeout=1),
}


def producer_of(message: str) -> str:
    keys = [key for key in PRODUCERS if key in message]
    assert len(keys) == 1, f"no single producer in PRODUCERS for {message!r}: {keys}"
    return keys[0]


def pattern(message: str) -> re.Pattern[str]:
    """The quoted message as a pattern: ``<...>`` stands for any text."""
    parts = re.split(r"<[^<>]+>", message)
    return re.compile(".+?".join(re.escape(p) for p in parts), re.S)


def error_class(name: str) -> type[BaseException]:
    if name == "UsageError":
        from IPython.core.error import UsageError

        return UsageError
    cls = getattr(errors, name)
    assert isinstance(cls, type) and issubclass(cls, BaseException)
    return cls


def test_every_quoted_error_line_has_its_producer() -> None:
    lines = quoted()
    assert len(lines) >= len(PRODUCERS), lines
    for _, _, message in lines:
        producer_of(message)  # fails, naming the line, when there is none
    used = {producer_of(message) for _, _, message in lines}
    assert used == set(PRODUCERS), f"producers no page quotes: {set(PRODUCERS) - used}"


def cases() -> Iterator[tuple[str, str, str]]:
    yield from quoted()


@pytest.mark.parametrize(
    ("page", "name", "message"), list(cases()), ids=[m[:48] for _, _, m in cases()]
)
def test_the_quoted_error_is_what_nbddp_raises(
    page: str, name: str, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    produce = PRODUCERS[producer_of(message)]
    try:
        produce(monkeypatch)
    except pytest.skip.Exception:
        raise
    except BaseException as raised:
        error = raised
    else:
        pytest.fail(f"{page}: {message!r}: nothing was raised")
    assert isinstance(error, error_class(name)), f"{page}: {name} quoted, {error!r} raised"
    first = str(error).splitlines()[0] if str(error) else ""
    assert pattern(message).fullmatch(first), f"{page} quotes\n  {message}\nnbddp says\n  {first}"
