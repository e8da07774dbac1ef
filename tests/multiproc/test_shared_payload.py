"""Large tensors reach every rank intact through shared memory, under every start method,
and a rank's writes stay its own (fork's copy-on-write semantics)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import nbddp
from nbddp.wire.payload import Payload
from tests.multiproc import fns


@pytest.fixture
def payloads(monkeypatch: pytest.MonkeyPatch) -> list[Payload]:
    """Every payload serialised from now on (a run lets its own go when it ends)."""
    made: list[Payload] = []
    real = Payload.serialize

    def recording(*args: Any, **kwargs: Any) -> Payload:
        payload = real(*args, **kwargs)
        made.append(payload)
        return payload

    monkeypatch.setattr(Payload, "serialize", recording)
    return made


@pytest.mark.parametrize("method", ["forkserver", "spawn", "fork"])
def test_large_tensors_arrive_intact_and_rank_writes_stay_private(
    method: str, payloads: list[Payload]
) -> None:
    data = torch.randn(8 << 20)  # 32 MiB
    model = torch.nn.Linear(512, 1024)  # 2 MiB of weights
    expected = {"data": fns.digest(data), "weight": fns.digest(model.weight)}
    run = nbddp.launch(
        fns.checksum_and_scribble,
        data,
        model,
        procs=2,
        start_method=method,
        block=False,
        output="none",
    )
    result = run.wait()
    assert result.values == {0: expected, 1: expected}
    # the ranks' writes did not reach the notebook
    assert (fns.digest(data), fns.digest(model.weight)) == (expected["data"], expected["weight"])
    (payload,) = payloads
    assert len(payload.data) < 1 << 20  # the tensors were not pickled into bytes
    assert len(payload.fds) == 2


def array_checksum_and_scribble(array: Any) -> tuple[float, bool]:
    total = float(array.sum())
    array[0] = -1.0  # copy-on-write: stays in this rank
    return total, bool(array.flags.writeable)


@pytest.mark.parametrize("method", ["forkserver", "spawn", "fork"])
def test_large_numpy_arrays_arrive_through_one_shared_copy(
    method: str, payloads: list[Payload]
) -> None:
    import numpy as np

    array = np.ones(4 << 20)  # 32 MiB
    run = nbddp.launch(
        array_checksum_and_scribble,
        array,
        procs=2,
        start_method=method,
        block=False,
        output="none",
    )
    expected = (float(4 << 20), True)
    assert run.wait().values == {0: expected, 1: expected}
    assert array[0] == 1.0
    (payload,) = payloads
    assert len(payload.data) < 1 << 20 and len(payload.fds) == 1


def test_a_launched_tensor_stays_where_it_was_and_its_views_with_it() -> None:
    data = torch.arange(10 << 20, dtype=torch.float32)  # 40 MiB: a block of its own
    view, address = data.numpy(), data.data_ptr()
    expected = fns.digest(data)
    for _ in range(2):  # the second launch finds it shared already
        model = torch.nn.Linear(2, 2)
        result = nbddp.launch(fns.checksum_and_scribble, data, model, procs=2, output="none")
        assert result["data"] == expected
    assert data.data_ptr() == address and fns.digest(data) == expected
    data[0] = 42.0
    assert view[0] == 42.0  # (a storage moved to shared memory left this view dangling)
