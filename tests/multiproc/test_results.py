"""Return values come back through shared memory, and a value that cannot be rebuilt says why.

Each test also gets the leftover-process check (tests/conftest.py).
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

import nbddp
from nbddp.launcher.run import UnloadedValue
from tests.multiproc import value_fns
from tests.procs import threads_and_fds as _resources


def test_large_tensors_arrays_and_state_dicts_come_back_in_shared_memory() -> None:
    nbddp.launch(value_fns.big_values, 8, procs=2, output="none")  # warm: loop thread
    gc.collect()
    threads, fds = _resources()
    value = nbddp.launch(value_fns.big_values, 8, procs=2, output="none")
    numel = (8 << 20) // 4
    assert torch.equal(value["tensor"], torch.arange(numel, dtype=torch.float32))
    assert np.array_equal(value["array"], np.arange(numel, dtype=np.float32))
    for i, (name, weight) in enumerate(value["state"].items()):
        assert name == f"layer{i}.weight" and bool((weight == i).all())
    # Not pickled into the message: the notebook maps the memory the rank filled.
    assert value["tensor"].untyped_storage().is_shared()
    assert all(w.untyped_storage().is_shared() for w in value["state"].values())
    assert not value["array"].flags.owndata
    value["tensor"] += 1  # the notebook's own: writable
    assert torch.equal(value["small"], torch.ones(3))
    del value, weight
    gc.collect()
    threads_after, fds_after = _resources()
    assert abs(threads_after - threads) <= 1 and abs(fds_after - fds) <= 1


def test_another_ranks_value_that_cannot_be_rebuilt_does_not_fail_launch() -> None:
    run = nbddp.launch(
        value_fns.rank1_returns_a_class_only_ranks_import, procs=2, block=False, output="none"
    )
    result = run.wait()
    assert result.values[0] == "plain"
    placeholder = result.values[1]
    assert isinstance(placeholder, UnloadedValue)
    assert placeholder.type_name == "rank_only_mod.Thing"
    assert "rank 1's return value (rank_only_mod.Thing)" in repr(placeholder)
    assert "ModuleNotFoundError" in repr(placeholder)


def test_rank0s_value_that_cannot_be_rebuilt_names_the_rank_and_type() -> None:
    with pytest.raises(nbddp.errors.ResultError) as info:
        nbddp.launch(value_fns.rank0_returns_a_value_that_fails_to_unpickle, procs=2, output="none")
    message = str(info.value)
    assert "rank 0's return value (tests.multiproc.value_fns.Fragile)" in message
    assert "ValueError: bad state" in message
    assert info.value.rank == 0 and isinstance(info.value.__cause__, ValueError)
