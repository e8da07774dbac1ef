"""Moving large storages into shared memory a chunk at a time."""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch

from nbddp.wire import shm_move

MiB = 1 << 20


def test_moved_storage_keeps_its_bytes_and_every_view() -> None:
    n = 160 * MiB // 4  # 160 MiB: 3 chunks
    t = torch.arange(n, dtype=torch.int32)
    view = t[5:10]
    shm_move.move_to_shared(t.untyped_storage())
    assert t.is_shared() and view.is_shared()
    assert torch.equal(t, torch.arange(n, dtype=torch.int32))
    t[5] = -1  # the view still aliases the tensor
    assert view.tolist() == [-1, 6, 7, 8, 9]


def test_peak_memory_stays_near_one_copy() -> None:
    # USS sampled after each chunk: the source's copied pages are released as
    # the shared copy grows, so the process never holds both in full.
    t = torch.ones(256 * MiB // 4)
    me = psutil.Process()
    before = me.memory_full_info().uss
    peaks: list[int] = []
    release = shm_move.release

    def measured(start: int, end: int) -> None:
        release(start, end)
        peaks.append(me.memory_full_info().uss)

    shm_move.release = measured  # type: ignore[assignment]
    try:
        shm_move.move_to_shared(t.untyped_storage())
    finally:
        shm_move.release = release  # type: ignore[assignment]
    assert len(peaks) == 4
    assert max(peaks) - before < 2 * shm_move.CHUNK  # not another 256 MiB
    assert float(t.sum()) == 256 * MiB // 4


def test_an_interrupted_move_puts_the_bytes_back() -> None:
    t = torch.arange(192 * MiB // 4, dtype=torch.int32)
    calls = []
    release = shm_move.release

    def interrupted(start: int, end: int) -> None:
        release(start, end)
        calls.append(start)
        if len(calls) == 2:
            raise KeyboardInterrupt

    shm_move.release = interrupted  # type: ignore[assignment]
    try:
        with pytest.raises(KeyboardInterrupt):
            shm_move.move_to_shared(t.untyped_storage())
    finally:
        shm_move.release = release  # type: ignore[assignment]
    assert not t.is_shared()
    assert torch.equal(t, torch.arange(192 * MiB // 4, dtype=torch.int32))


def test_borrowed_memory_goes_through_share_memory(tmp_path: Path) -> None:
    # numpy's buffer is not torch's to release: the usual copy, numpy untouched.
    array = np.ones(80 * MiB // 8)
    t = torch.from_numpy(array)
    shm_move.move_to_shared(t.untyped_storage())
    assert t.is_shared() and float(array.sum()) == 80 * MiB // 8
    # A private file mapping is not anonymous memory.
    path = tmp_path / "f"
    path.write_bytes(b"\1" * (2 * MiB))
    with path.open("r+b") as f:
        region = mmap.mmap(f.fileno(), 2 * MiB, flags=mmap.MAP_PRIVATE)
        view = torch.frombuffer(region, dtype=torch.uint8)
        assert not shm_move.anonymous(view.data_ptr(), 2 * MiB)
        del view
        region.close()


def test_torch_allocations_are_anonymous() -> None:
    t = torch.empty(100 * MiB, dtype=torch.uint8)
    assert shm_move.anonymous(t.data_ptr(), 100 * MiB)
    assert not shm_move.anonymous(0x10, 4096)  # nothing mapped there
