"""multiprocessing objects in the payload, pickled and rebuilt in one process."""

from __future__ import annotations

import multiprocessing
import os

import pytest

from nbddp.errors import PayloadError
from nbddp.wire import mpobjects
from nbddp.wire.payload import Payload, load_call


def _round_trip(*args: object) -> tuple[object, ...]:
    payload = Payload.serialize(print, args, {})
    return load_call(payload.ref()).args


def test_a_pipe_end_is_rebuilt_on_a_descriptor_of_its_own_that_reaches_the_same_pipe() -> None:
    reader, writer = multiprocessing.Pipe(duplex=False)
    (rebuilt,) = _round_trip(writer)
    assert isinstance(rebuilt, type(writer))
    assert rebuilt.fileno() != writer.fileno()
    rebuilt.send("hello")
    assert reader.recv() == "hello"
    rebuilt.close()


def test_a_value_is_rebuilt_over_the_same_shared_memory() -> None:
    value = multiprocessing.get_context("spawn").Value("i", 1)
    (rebuilt,) = _round_trip(value)
    rebuilt.value = 7  # type: ignore[attr-defined]
    assert value.value == 7


def test_a_fork_context_lock_that_cannot_be_mapped_is_refused_before_launch_unless_forked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(mpobjects, "_mapping_of", lambda address: None)
    lock = multiprocessing.get_context("fork").Lock()
    with pytest.raises(PayloadError) as info:
        Payload.serialize(print, (lock,), {})
    message = str(info.value)
    assert message.startswith("cannot send argument 0 (multiprocessing.synchronize.Lock)")
    assert "get_context('spawn')" in message and "start_method='fork'" in message
    assert "\n" not in message
    Payload.serialize(print, (lock,), {}, forked=True)  # a forked rank inherits it


def test_a_payload_keeps_no_descriptor_of_its_own_for_objects_it_sends() -> None:
    queue = multiprocessing.get_context("spawn").SimpleQueue()
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(3):
        Payload.serialize(print, (queue,), {})
    assert len(os.listdir("/proc/self/fd")) == before
