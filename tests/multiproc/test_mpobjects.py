"""multiprocessing objects passed to the ranks, as torch's spawn passes them.

Queues, events, values and pipes from every context (``multiprocessing``'s
default, spawn, forkserver and fork contexts, ``torch.multiprocessing``)
reach 2 gloo CPU ranks under every start method, and what the ranks put in
them is read in the notebook.
"""

from __future__ import annotations

import multiprocessing
import threading

import psutil
import pytest

import nbddp
from tests.multiproc import mpfns

METHODS = ["forkserver", "spawn", "fork"]
CONTEXTS = [None, "spawn", "fork", "forkserver"]


def _context(name: str | None) -> multiprocessing.context.BaseContext:
    return multiprocessing.get_context(name)


@pytest.mark.parametrize("context", CONTEXTS)
@pytest.mark.parametrize("method", METHODS)
def test_each_rank_puts_a_value_on_a_simple_queue_read_in_the_notebook(
    method: str, context: str | None
) -> None:
    queue = _context(context).SimpleQueue()
    nbddp.spawn(mpfns.put_rank, args=(queue,), nprocs=2, start_method=method)
    assert sorted([queue.get(), queue.get()]) == [0, 10]
    assert queue.empty()


@pytest.mark.parametrize("method", METHODS)
def test_a_torch_multiprocessing_queue_carries_each_ranks_value(method: str) -> None:
    import torch.multiprocessing as tmp

    queue = tmp.Queue()
    nbddp.spawn(mpfns.put_rank, args=(queue,), nprocs=2, start_method=method)
    # Queue.put hands the item to a feeder thread: the rank flushes it before it ends.
    assert sorted([queue.get(timeout=10), queue.get(timeout=10)]) == [0, 10]


@pytest.mark.parametrize("context", CONTEXTS)
@pytest.mark.parametrize("method", METHODS)
def test_an_event_set_and_a_value_changed_in_the_ranks_are_seen_in_the_notebook(
    method: str, context: str | None
) -> None:
    ctx = _context(context)
    event, value = ctx.Event(), ctx.Value("i", 0)
    nbddp.spawn(mpfns.set_event_and_add, args=(event, value), nprocs=2, start_method=method)
    assert event.is_set()
    assert value.value == 2


@pytest.mark.parametrize("method", METHODS)
def test_a_pipe_end_captured_in_a_closure_carries_each_ranks_message(method: str) -> None:
    reader, writer = multiprocessing.Pipe(duplex=False)

    def send(rank: int) -> None:
        mpfns.send_on_pipe(rank, writer)

    nbddp.spawn(send, nprocs=2, start_method=method)
    assert sorted([reader.recv(), reader.recv()]) == [0, 1]


def test_launches_with_multiprocessing_objects_leak_no_fds_or_threads() -> None:
    queue = multiprocessing.SimpleQueue()
    nbddp.spawn(mpfns.put_rank, args=(queue,), nprocs=2)  # warm: loop thread, forkserver
    queue.get(), queue.get()
    me = psutil.Process()
    before = (threading.active_count(), me.num_fds())
    for _ in range(5):
        nbddp.spawn(mpfns.put_rank, args=(queue,), nprocs=2)
        assert sorted([queue.get(), queue.get()]) == [0, 10]
    assert threading.active_count() <= before[0]
    assert me.num_fds() <= before[1]
