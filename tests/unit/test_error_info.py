"""A rank's exception is always described, even one that resists it: its type name and
traceback text always cross, the exception itself only when it rebuilds as itself."""

from __future__ import annotations

import pickle
from pathlib import Path

from nbddp.errors import WorkerError
from nbddp.launcher.events import Failure
from nbddp.launcher.failures import rank_error
from nbddp.rank.worker import error_info
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
    assert info.exc_bytes is None


def test_an_exception_that_rebuilds_as_something_else_is_not_shipped() -> None:
    info = error_info(_raised(RebuildsAsInt("x")))
    assert info.type_name.endswith(".RebuildsAsInt") and info.message == "x"
    assert info.exc_bytes is None


def test_bytes_that_rebuild_as_no_exception_become_a_worker_error(tmp_path: Path) -> None:
    info = ErrorInfo("mod.Odd", "odd", "Traceback ...\nmod.Odd: odd\n", pickle.dumps(5))
    exc = rank_error(Failure(0, "raised", error=info), 1, tmp_path)
    assert isinstance(exc, WorkerError) and exc.remote_type == "mod.Odd"
