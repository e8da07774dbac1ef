"""Large tensors travel as shared-memory descriptors, mapped copy-on-write by the ranks."""

from __future__ import annotations

import gc
import os

import torch

from nbddp.wire import shm
from nbddp.wire.payload import Payload, load_call


def test_large_tensors_become_descriptors_and_small_ones_stay_bytes() -> None:
    big = torch.arange(1 << 20, dtype=torch.float32)  # 4 MiB
    address = big.data_ptr()
    small = torch.ones(10)
    data, fds, _keep, _ = shm.dumps({"big": big, "view": big[10:20], "small": small})
    assert len(fds) == 1  # one storage, shared by the tensor and its view
    assert len(data) < 64 << 10  # not the 4 MiB
    assert big.data_ptr() == address  # never moved: views of it (numpy's too) stay valid
    out = shm.loads(data, [os.dup(fds[0])])
    assert torch.equal(out["big"], big)
    assert torch.equal(out["view"], big[10:20])
    assert torch.equal(out["small"], small)


def test_a_rank_writing_to_its_copy_leaves_the_notebooks_tensor_alone() -> None:
    big = torch.zeros(1 << 19, dtype=torch.float64)
    data, fds, _keep, _ = shm.dumps(big)
    theirs = shm.loads(data, [os.dup(fds[0])])
    theirs += 1  # copy-on-write: only this mapping changes
    assert float(big.sum()) == 0.0
    assert float(theirs.sum()) == float(1 << 19)


def test_parameters_keep_their_type_and_requires_grad() -> None:
    layer = torch.nn.Linear(1024, 1024)  # 4 MiB of weights
    data, fds, _keep, _ = shm.dumps(layer)
    copy = shm.loads(data, [os.dup(fd) for fd in fds])
    assert isinstance(copy.weight, torch.nn.Parameter) and copy.weight.requires_grad
    assert torch.equal(copy.weight, layer.weight)


def test_payload_carries_the_descriptors() -> None:
    big = torch.ones(1 << 20)
    payload = Payload.serialize(lambda t: float(t.sum()), (big,), {})
    assert len(payload.fds) == 1
    call = load_call(payload.ref())
    assert call.fn(*call.args) == float(1 << 20)


def test_large_numpy_arrays_travel_as_one_memfd_mapped_copy_on_write() -> None:
    import numpy as np

    c = np.arange(1 << 18, dtype=np.float64).reshape(512, 512)  # 2 MiB
    f = np.asfortranarray(c)
    when = np.array(["2026-01-01"] * (1 << 18), dtype="datetime64[s]")
    data, fds, owned, _ = shm.dumps({"c": c, "again": c, "f": f, "when": when, "small": c[:2]})
    assert len(fds) == 3 and len(owned) == 3  # c once, though referenced twice
    assert len(data) < 64 << 10
    out = shm.loads(data, [os.dup(fd) for fd in fds])
    assert np.array_equal(out["c"], c) and out["again"] is out["c"]
    assert np.array_equal(out["f"], f) and out["f"].flags.f_contiguous
    assert np.array_equal(out["when"], when) and np.array_equal(out["small"], c[:2])
    out["c"][0, 0] = -1.0  # copy-on-write: the notebook's array is untouched
    assert c[0, 0] == 0.0


def test_object_and_strided_arrays_are_pickled_as_usual() -> None:
    import numpy as np

    objects = np.array([object()] * (1 << 18))
    strided = np.zeros((1024, 1024))[:, ::2]
    _, fds, _keep, _ = shm.dumps({"o": objects, "s": strided})
    assert fds == []


def test_array_descriptors_close_with_the_payload() -> None:
    import numpy as np

    payload = Payload.serialize(lambda a: float(a.sum()), (np.ones(1 << 18),), {})
    (fd,) = payload.fds
    made = os.fstat(fd)  # open while the payload lives
    call = load_call(payload.ref())
    assert call.fn(*call.args) == float(1 << 18)
    del payload, call
    gc.collect()
    # The number may already name another file opened since (by another thread):
    # only the same memfd still open there means it outlived its payload.
    try:
        now = os.fstat(fd)
    except OSError:
        return
    assert (now.st_dev, now.st_ino) != (made.st_dev, made.st_ino), "the memfd outlived its payload"


class _LoadedWhenUnpickled:
    """Unpickles as another payload, loaded while the outer one is being loaded."""

    def __init__(self, data: bytes, fd: int) -> None:
        self.data, self.fd = data, fd

    def __reduce__(self) -> tuple[object, tuple[bytes, list[int]]]:
        return shm.loads, (self.data, [self.fd])


def test_each_load_maps_its_own_descriptors_even_when_nested() -> None:
    inner_tensor = torch.full((1 << 18,), 2.0)  # 1 MiB each: both shared
    outer_tensor = torch.full((1 << 18,), 3.0)
    inner_data, inner_fds, _keep, _ = shm.dumps(inner_tensor)
    nested = _LoadedWhenUnpickled(inner_data, os.dup(inner_fds[0]))
    # The inner payload is loaded first, then the outer tensor is rebuilt from
    # the outer descriptors: the inner load must not have replaced them.
    data, fds, _keep, _ = shm.dumps([nested, outer_tensor])
    assert len(fds) == 1
    inner, outer = shm.loads(data, [os.dup(fds[0])])
    assert torch.equal(inner, inner_tensor)
    assert torch.equal(outer, outer_tensor)
