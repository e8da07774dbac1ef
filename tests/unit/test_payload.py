"""Payload serialisation: what cannot be pickled is named, with its path, before any process."""

from __future__ import annotations

import socket
import sqlite3
import threading
from collections.abc import Callable
from typing import Any

import pytest

from nbddp.errors import PayloadError
from nbddp.wire.payload import Payload, load_call

LOCK = threading.Lock()


def make_closure(obj: object) -> Callable[[], object]:
    def train() -> object:
        return obj

    return train


def test_round_trip_of_lambda_closure_and_local_class() -> None:
    class Local:
        def __init__(self, v: int) -> None:
            self.v = v

    payload = Payload.serialize(lambda a, b=1: Local(a + b).v, (2,), {"b": 3})
    assert payload.fds == ()
    call = load_call(payload.ref())
    assert call.fn(*call.args, **call.kwargs) == 5


@pytest.mark.parametrize(
    ("culprit", "needle"),
    [
        (threading.Lock(), "closure 'obj' (_thread.lock)"),
        (sqlite3.connect(":memory:"), "closure 'obj' (sqlite3.Connection)"),
        ((i for i in range(3)), "closure 'obj' (generator)"),
        (socket.socket(), "closure 'obj' (socket.socket)"),
    ],
)
def test_unpicklable_closure_is_named(culprit: object, needle: str) -> None:
    with pytest.raises(PayloadError) as info:
        Payload.serialize(make_closure(culprit), (), {})
    message = str(info.value)
    assert f"make_closure.<locals>.train -> {needle}" in message
    assert "Create it inside the function" in message
    if isinstance(culprit, socket.socket):
        culprit.close()


def test_unpicklable_global_and_nested_argument_are_named(tmp_path: Any) -> None:
    def uses_global() -> object:
        return LOCK

    with pytest.raises(PayloadError, match=r"uses_global -> global 'LOCK' \(_thread.lock\)"):
        Payload.serialize(uses_global, (), {})
    with (
        open(tmp_path / "f.txt", "w") as handle,
        pytest.raises(
            PayloadError, match=r"keyword argument 'cfg' -> \['log'\] \(_io.TextIOWrapper\)"
        ),
    ):
        Payload.serialize(print, (), {"cfg": {"log": handle}})


def test_non_callable_is_rejected() -> None:
    with pytest.raises(PayloadError, match="must be callable, got int"):
        Payload.serialize(3, (), {})  # type: ignore[arg-type]
