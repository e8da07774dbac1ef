"""Large tensors travel as shared-memory descriptors, mapped copy-on-write by the ranks."""

from __future__ import annotations

import os

import torch

from nbddp import shm
from nbddp.payload import Payload


def test_large_tensors_become_descriptors_and_small_ones_stay_bytes() -> None:
    big = torch.arange(1 << 20, dtype=torch.float32)  # 4 MiB
    small = torch.ones(10)
    data, fds = shm.dumps({"big": big, "view": big[10:20], "small": small})
    assert len(fds) == 1  # one storage, shared by the tensor and its view
    assert len(data) < 64 << 10  # not the 4 MiB
    assert big.is_shared()  # moved in place: the notebook keeps using the same tensor
    out = shm.loads(data, [os.dup(fds[0])])
    assert torch.equal(out["big"], big)
    assert torch.equal(out["view"], big[10:20])
    assert torch.equal(out["small"], small)


def test_a_rank_writing_to_its_copy_leaves_the_notebooks_tensor_alone() -> None:
    big = torch.zeros(1 << 19, dtype=torch.float64)
    data, fds = shm.dumps(big)
    theirs = shm.loads(data, [os.dup(fds[0])])
    theirs += 1  # copy-on-write: only this mapping changes
    assert float(big.sum()) == 0.0
    assert float(theirs.sum()) == float(1 << 19)


def test_parameters_keep_their_type_and_requires_grad() -> None:
    layer = torch.nn.Linear(1024, 1024)  # 4 MiB of weights
    data, fds = shm.dumps(layer)
    copy = shm.loads(data, [os.dup(fd) for fd in fds])
    assert isinstance(copy.weight, torch.nn.Parameter) and copy.weight.requires_grad
    assert torch.equal(copy.weight, layer.weight)


def test_payload_carries_the_descriptors() -> None:
    big = torch.ones(1 << 20)
    payload = Payload.serialize(lambda t: float(t.sum()), (big,), {})
    assert len(payload.fds) == 1
    call = Payload.from_bytes(payload.data, [os.dup(payload.fds[0])])
    assert call.fn(*call.args) == float(1 << 20)
