"""A rank's exception is always described, even one that resists it: its type name and
traceback text always cross, the exception itself only when it rebuilds as itself.
The traceback shown has no frame of nbddp's and names cells as IPython does; the one
the rank's log keeps has every frame."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import nbddp
from nbddp.errors import RemoteError
from nbddp.launcher.events import Failure, RankOutcome, RankState
from nbddp.launcher.failures import rank_error, release
from nbddp.notebook.program import build_program
from nbddp.rank import context
from nbddp.rank.context import WithRank
from nbddp.rank.worker import error_info
from nbddp.wire import values
from nbddp.wire.descriptors import Descriptors
from nbddp.wire.protocol import ErrorInfo, Placement
from tests.multiproc.failing import RebuildsAsInt, StrRaises


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:
        return caught


def test_an_exception_whose_str_raises_is_described_without_it() -> None:
    info = error_info(_raised(StrRaises("x")))
    assert info.type_name.endswith(".StrRaises")
    assert info.message == "<its str() raised RuntimeError>"
    assert "raise exc" in info.traceback and "StrRaises" in info.traceback
    assert info.exc is None


def test_an_exception_that_rebuilds_as_something_else_is_not_shipped() -> None:
    info = error_info(_raised(RebuildsAsInt("x")))
    assert info.type_name.endswith(".RebuildsAsInt") and info.message == "x"
    assert info.exc is None


def test_bytes_that_rebuild_as_no_exception_become_a_remote_error(tmp_path: Path) -> None:
    info = ErrorInfo("mod.Odd", "odd", "Traceback ...\nmod.Odd: odd\n", values.pack(5))
    exc = rank_error(Failure(0, "raised", error=info), 1, tmp_path)
    assert isinstance(exc, RemoteError) and exc.remote_type == "mod.Odd"


def test_an_exceptions_large_tensor_is_packed_into_shared_memory_not_bytes() -> None:
    batch = torch.arange(1 << 20, dtype=torch.float32)  # 4 MiB
    info = error_info(_raised(ValueError("bad batch", batch)))
    assert info.exc is not None
    assert len(info.exc.fds) == 1 and len(info.exc.data) < 4096
    rebuilt = values.unpack(info.exc)
    assert type(rebuilt) is ValueError and torch.equal(rebuilt.args[1], batch)
    assert rebuilt.args[1].untyped_storage().is_shared()


def test_releasing_a_runs_outcomes_closes_their_exceptions_shared_memory() -> None:
    sent = error_info(_raised(ValueError("bad batch", torch.zeros(1 << 20)))).exc
    assert sent is not None and len(sent.fds) == 1
    # As the notebook holds it: its own duplicates of the descriptors, owned.
    dups = [os.dup(fd) for fd in sent.fds.fds]
    packed = replace(sent, fds=Descriptors(dups, owned=True))
    error = ErrorInfo("builtins.ValueError", "bad batch", "", packed)
    release([RankOutcome(1, RankState.FAILED, 100, 1, True, None, error, 0.0, 1.0)])
    for fd in dups:
        with pytest.raises(OSError):
            os.fstat(fd)


CELL = """\
def inner(rank):
    raise ValueError(f"mine on rank {rank}")
try:
    WithRank(inner)()
except ValueError as exc:
    raise KeyError("again") from exc
"""


def test_nbddp_frames_are_left_out_of_what_is_shown_and_kept_in_the_log() -> None:
    # A %%ddp cell (run by nbddp's cell program) calls its own function through one
    # of nbddp's wrappers, and raises again from what that raised: nbddp's frames are
    # outside the cell, between its frames, and in the chained exception.
    program = build_program(
        CELL, header="%%ddp", filename="<ddp cell [12]>", user_ns={"WithRank": WithRank}
    )
    context.install(Placement(0, 0, 2, "cpu", None))
    try:
        with pytest.raises(KeyError) as raised:
            replace(program, shown="Cell In[12]")()
    finally:
        context.install(None)
    info = error_info(raised.value)
    package = os.path.dirname(nbddp.__file__)
    assert package not in info.traceback
    assert info.traceback.count("Traceback (most recent call last):") == 2
    for head, line in [
        ("Cell In[12], line 3, in inner", 'raise ValueError(f"mine on rank {rank}")'),
        ("Cell In[12], line 5, in <module>", "WithRank(inner)()"),
        ("Cell In[12], line 7, in <module>", 'raise KeyError("again") from exc'),
    ]:
        assert f"  {head}\n    {line}\n" in info.traceback
    assert "The above exception was the direct cause" in info.traceback
    # The log keeps every frame: the cell program's and the wrapper's too.
    full = info.logged
    assert os.path.join(package, "rank", "cell.py") in full
    assert os.path.join(package, "rank", "context.py") in full
    assert "  Cell In[12], line 5, in <module>\n" in full
