"""A finished run is freed once the user drops it: its job, its payload, the
shared memory of its arguments, values and exceptions.

Each test also gets the leftover-process check (tests/conftest.py).
"""

from __future__ import annotations

import gc
import os
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np
import psutil
import pytest
import torch

import nbddp
from nbddp import entry
from nbddp.launcher.job import Job
from nbddp.launcher.relay import loop
from nbddp.wire import protocol
from tests.multiproc import lifetime_fns
from tests.procs import threads_and_fds as _resources

MIB = 1 << 20


class _Recorded:
    """Weak references to every job started, and to its payload."""

    def __init__(self) -> None:
        self.jobs: list[weakref.ref[object]] = []
        self.payloads: list[weakref.ref[object]] = []

    def alive(self) -> tuple[int, int]:
        """How many jobs and payloads are still alive."""
        return (
            sum(ref() is not None for ref in self.jobs),
            sum(ref() is not None for ref in self.payloads),
        )


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> _Recorded:
    record = _Recorded()

    class RecordedJob(Job):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            record.jobs.append(weakref.ref(self.core))  # what a Run holds of its job
            record.payloads.append(weakref.ref(self.payload))

    monkeypatch.setattr(entry, "Job", RecordedJob)
    return record


@pytest.fixture
def no_gc() -> Iterator[None]:
    """Only reference counting frees objects: a cycle would keep them."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _loop_idle() -> None:
    """Return once the relay loop has finished what it was doing (it ends runs)."""
    for _ in range(2):
        done = threading.Event()
        loop().call(done.set)
        assert done.wait(10.0)


def _shared_memory() -> list[int]:
    """The size of each shared-memory file this process holds a descriptor of."""
    sizes = []
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
            if target.startswith(("/memfd:", "/dev/shm/")):
                sizes.append(os.fstat(int(name)).st_size)
        except OSError:
            continue
    return sizes


def _memfds() -> int:
    return len(_shared_memory())


def test_a_finished_run_frees_its_job_and_payload_without_the_garbage_collector(
    recorded: _Recorded, no_gc: None
) -> None:
    x = torch.ones(2 * MIB // 4)
    for _ in range(2):
        assert nbddp.launch(lifetime_fns.total, x, procs=2, output="none") == x.numel()
    run = nbddp.launch(lifetime_fns.total, x, procs=2, output="none", block=False)
    assert run.wait().values[0] == x.numel()
    del run
    _loop_idle()
    assert recorded.alive() == (0, 0)


def test_a_failed_run_frees_its_payload_at_its_end_and_its_job_once_collected(
    recorded: _Recorded, no_gc: None
) -> None:
    x = torch.ones(2 * MIB // 4)
    run = nbddp.launch(lifetime_fns.fail_with, x, procs=2, output="none", block=False)
    with pytest.raises(ValueError, match="failed after reading"):
        run.wait()
    _loop_idle()
    # The run is still held here (as %ddp_status holds the latest): its job may
    # live on, the payload (the arguments' shared memory) not.
    assert recorded.alive() == (1, 0)
    del run
    gc.collect()  # the raised exception's traceback refers to the run that raised it
    assert recorded.alive() == (0, 0)


def test_a_kept_runs_payload_array_memory_is_closed_when_the_run_ends() -> None:
    nbddp.launch(lifetime_fns.total, np.ones(4), procs=2, output="none")  # warm
    _loop_idle()
    gc.collect()
    before = _memfds()
    array = np.ones(100 * MIB // 8)
    run = nbddp.launch(lifetime_fns.total, array, procs=2, output="none", block=False)
    assert run.wait().values[0] == array.size
    _loop_idle()
    assert _memfds() == before + 1  # the array itself, shared where it lies: no copy of it
    assert run.status == "done"
    del array
    gc.collect()
    assert _memfds() == before  # its shared memory went with it


def test_a_kept_run_with_restarts_lets_its_arguments_memory_go_at_its_end() -> None:
    nbddp.launch(lifetime_fns.total, np.ones(4), procs=2, output="none")  # warm
    _loop_idle()
    gc.collect()
    before = _memfds()
    array = np.ones(100 * MIB // 8)
    run = nbddp.launch(
        lifetime_fns.total, array, procs=2, output="none", block=False, max_restarts=1
    )
    assert run.wait().values[0] == array.size
    _loop_idle()
    assert _memfds() == before + 1  # no restart can come: only the array's own memory is left
    del array
    gc.collect()
    assert _memfds() == before


def test_a_values_shared_memory_is_closed_when_the_user_drops_it() -> None:
    nbddp.launch(lifetime_fns.tensor_of, 1, procs=2, output="none")  # warm
    _loop_idle()
    gc.collect()
    before = _memfds()
    value = nbddp.launch(lifetime_fns.tensor_of, 8, procs=2, output="none")
    assert float(value[0]) == 7.0 and value.untyped_storage().is_shared()
    _loop_idle()
    assert _memfds() == before + 1  # the one storage the value maps
    del value
    assert _memfds() == before


def test_twenty_launches_grow_neither_fds_nor_memory() -> None:
    array = np.ones(16 * MIB // 8)
    for _ in range(2):  # warm: the loop thread, the forkserver, allocator pools, the array
        nbddp.launch(lifetime_fns.tensor_of, 16, procs=2, output="none")  # shared in place
        nbddp.launch(lifetime_fns.total, array, procs=2, output="none")
    _loop_idle()
    gc.collect()
    me = psutil.Process()
    fds, rss, shared = me.num_fds(), me.memory_info().rss, sum(_shared_memory())
    for _ in range(20):
        value = nbddp.launch(lifetime_fns.tensor_of, 16, procs=2, output="none")
        assert nbddp.launch(lifetime_fns.total, array, procs=2, output="none") == array.size
        del value
    _loop_idle()
    # Held, each launch would keep 16 MiB of value and 16 MiB of payload: 640 MiB.
    assert me.num_fds() - fds <= 1  # the last run's store may still be closing its socket
    assert me.memory_info().rss - rss < 96 * MIB
    assert sum(_shared_memory()) - shared < 16 * MIB


def test_an_exception_holding_a_large_tensor_arrives_intact_through_shared_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nbddp.launch(lifetime_fns.total, torch.ones(4), procs=2, output="none")  # warm
    _loop_idle()
    gc.collect()
    threads, fds = _resources()
    read = [0]
    feed = protocol.FrameReader.feed

    def counted(self: protocol.FrameReader, data: bytes, fds: Any = ()) -> Any:
        read[0] += len(data)
        return feed(self, data, fds)

    monkeypatch.setattr(protocol.FrameReader, "feed", counted)
    with pytest.raises(lifetime_fns.BadBatch) as caught:
        nbddp.launch(lifetime_fns.raise_bad_batch, 64, procs=2, output="none")
    batch = caught.value.batch
    assert str(caught.value.args[0]) == "loss became nan on this batch"
    assert torch.equal(batch, torch.arange(64 * MIB // 4, dtype=torch.float32))
    shared = batch.untyped_storage().is_shared()
    assert shared  # mapped, not unpickled from bytes
    assert read[0] < MIB  # the control channel carried small messages only
    del caught, batch
    gc.collect()
    _loop_idle()
    threads_after, fds_after = _resources()
    assert abs(threads_after - threads) <= 1 and abs(fds_after - fds) <= 1


def test_the_shared_memory_of_exceptions_other_ranks_raised_is_closed_with_the_result() -> None:
    nbddp.launch(lifetime_fns.total, torch.ones(4), procs=2, output="none")  # warm
    _loop_idle()
    gc.collect()
    before = _memfds()
    run = nbddp.launch(
        lifetime_fns.every_rank_raises_bad_batch, 8, procs=2, output="none", block=False
    )
    with pytest.raises(lifetime_fns.BadBatch) as caught:
        run.wait()
    rank = caught.value.batch[0].item()
    assert caught.value.args[0] == f"rank {rank:g} broke"
    assert {o.error.type_name for o in run.outcomes() if o.error} == {
        "tests.multiproc.lifetime_fns.BadBatch"
    }
    _loop_idle()
    # The run is kept: only the exception raised holds its batch, not the other rank's.
    assert _memfds() == before + 1
    del caught, run
    gc.collect()
    assert _memfds() == before
