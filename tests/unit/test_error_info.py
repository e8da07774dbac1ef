"""A rank's exception is always described, even one that resists it: its type name and
traceback text always cross, the exception itself only when it rebuilds as itself."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from nbddp.errors import RemoteError
from nbddp.launcher.events import Failure, RankOutcome, RankState
from nbddp.launcher.failures import rank_error, release
from nbddp.rank.worker import error_info
from nbddp.wire import values
from nbddp.wire.descriptors import Descriptors
from nbddp.wire.protocol import ErrorInfo
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
