"""A large notebook tensor or array is shared where it lies: same address, same values, no copy."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from nbddp.wire import inplace, shm

MIB = 1 << 20
BIG = 40 * MIB  # above glibc's largest mmap threshold: always a block of its own


def _memfd_pages(address: int) -> bool:
    """True if ``address`` lies in a mapping of nbddp's shared memory."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            span = line.split()[0]
            lo, hi = (int(x, 16) for x in span.split("-"))
            if lo <= address < hi:
                return "nbddp-shared" in line
    return False


def test_a_numpy_view_of_a_sent_tensor_stays_valid() -> None:
    # Moving the storage (share_memory_) freed the memory a numpy view still
    # pointed at: reading the view crashed the notebook.
    code = textwrap.dedent(
        """
        import torch
        from nbddp.wire import shm
        t = torch.arange(10 << 20, dtype=torch.float32)
        view = t.numpy()
        shm.dumps(t)
        t[0] = 42
        print(view[0], view[5])
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["42.0", "5.0"]


def test_a_large_tensor_keeps_its_address_and_values_and_its_pages_become_shared() -> None:
    t = torch.arange(BIG // 4, dtype=torch.float32)
    address = t.data_ptr()
    data, fds, _keep, _ = shm.dumps(t)
    assert t.data_ptr() == address and torch.equal(t, torch.arange(BIG // 4).float())
    assert _memfd_pages(address + 2 * MIB)  # the whole pages now lie in shared memory
    ranks = shm.loads(data, [os.dup(fds[0])])
    assert torch.equal(ranks, t)
    ranks += 1  # copy-on-write in the rank: the notebook's tensor is untouched
    assert float(t[7]) == 7.0
    t[7] = -1.0  # the notebook's own writes are the next call's values
    data, fds2, _keep, _ = shm.dumps(t)
    assert float(shm.loads(data, [os.dup(fds2[0])])[7]) == -1.0


def test_a_tensor_sent_again_is_not_copied_again() -> None:
    t = torch.ones(BIG // 4)
    _, first, keep, _ = shm.dumps({"x": t})
    _, again, _keep, _ = shm.dumps({"y": t[10:]})
    made, now = os.fstat(first[0]), os.fstat(again[0])
    assert (made.st_dev, made.st_ino) == (now.st_dev, now.st_ino)
    del keep


def test_the_bytes_at_the_ends_of_the_buffer_are_the_current_ones() -> None:
    # The partial pages at either end stay private: they are written at each send.
    t = torch.zeros(BIG + 3, dtype=torch.uint8)
    shm.dumps(t)
    t[0], t[-1] = 7, 9
    data, fds, _keep, _ = shm.dumps(t)
    got = shm.loads(data, [os.dup(fds[0])])
    assert (int(got[0]), int(got[-1]), int(got.sum())) == (7, 9, 16)


def test_a_large_array_is_shared_in_place_too() -> None:
    a = np.arange(BIG // 8, dtype=np.float64)
    address = a.ctypes.data
    data, fds, _keep, _ = shm.dumps(a)
    assert a.ctypes.data == address and _memfd_pages(address + MIB)
    assert np.array_equal(shm.loads(data, [os.dup(fds[0])]), a)


def test_a_forked_childs_writes_stay_its_own() -> None:
    t = torch.zeros(BIG // 4)
    shm.dumps(t)
    pid = os.fork()
    if pid == 0:  # the child writes all over it, as a forked launcher's rank would
        t.numpy()[:] = 5.0  # (numpy: torch's thread pool is not to be used after a fork)
        os._exit(0 if t.numpy()[123] == 5.0 else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert float(t.sum()) == 0.0


def test_a_freed_tensors_shared_memory_is_released() -> None:
    t = torch.ones(BIG // 4)
    _, fds, keep, _ = shm.dumps(t)
    made = os.fstat(fds[0])
    del t, keep, fds
    gc.collect()
    assert not any((s.st_dev, s.st_ino) == (made.st_dev, made.st_ino) for s in _open_files()), (
        "the shared memory outlived its tensor"
    )


def _held() -> set[int]:
    """The addresses of the buffers shared in place now."""
    inplace.forget_gone()
    return set(inplace._HELD)


def _open_files() -> list[os.stat_result]:
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            found.append(os.fstat(int(name)))
        except OSError:
            continue
    return found


def test_heap_memory_is_copied_and_left_alone() -> None:
    t = torch.ones(MIB // 4 + 1)  # may lie on the heap, beside other objects: never moved
    address = t.data_ptr()
    data, fds, _keep, _ = shm.dumps(t)
    assert t.data_ptr() == address and not t.is_shared()
    assert torch.equal(shm.loads(data, [os.dup(fds[0])]), t)


def test_a_tensor_once_viewed_through_numpy_is_not_copied_again() -> None:
    t = torch.ones(BIG // 4)
    t.numpy()  # torch marks its storage fixed in size from then on
    address = t.data_ptr()
    _, first, _keep, _ = shm.dumps(t)
    assert _memfd_pages(address + MIB)
    _, again, _keep2, _ = shm.dumps(t)
    assert os.fstat(first[0]).st_ino == os.fstat(again[0]).st_ino


@pytest.mark.parametrize("make", ["bytearray", "numpy"])
def test_memory_a_tensor_borrows_is_shared_and_private_again_once_the_tensor_goes(
    make: str,
) -> None:
    if make == "bytearray":
        backing: bytearray | np.ndarray = bytearray(b"\x07") * BIG
        t = torch.frombuffer(backing, dtype=torch.uint8)
    else:
        backing = np.full(BIG, 7, np.uint8)
        t = torch.from_numpy(backing)
    address = t.data_ptr()
    _, fds, keep, _ = shm.dumps(t)
    assert _memfd_pages(address + MIB)
    made = os.fstat(fds[0])
    del t, fds, keep
    gc.collect()  # the tensor is gone; the memory it borrowed lives on, its owner's again
    assert not any((s.st_dev, s.st_ino) == (made.st_dev, made.st_ino) for s in _open_files())
    pid = os.fork()
    if pid == 0:  # a forked child's writes stay its own, as with any private memory
        memoryview(backing)[MIB] = 9
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert memoryview(backing)[MIB] == 7 and memoryview(backing)[BIG - 1] == 7


def test_the_registry_forgets_what_is_gone() -> None:
    t = torch.ones(BIG // 4)
    address = t.data_ptr()
    shm.dumps(t)
    assert address in _held()
    del t
    gc.collect()
    assert address not in _held()


def test_a_storage_resized_since_is_shared_afresh_and_a_child_keeps_its_memory() -> None:
    t = torch.ones(BIG // 4)
    old = t.data_ptr()
    shm.dumps(t)
    t.resize_(BIG // 2)  # a new block: the old one is freed
    t.fill_(3.0)
    assert old not in _held()
    data, fds, _keep, _ = shm.dumps(t)
    assert float(shm.loads(data, [os.dup(fds[0])]).sum()) == 3.0 * (BIG // 2)
    pid = os.fork()  # nothing is mapped over what the old block's addresses hold now
    if pid == 0:
        os._exit(0 if t.numpy()[-1] == 3.0 else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
