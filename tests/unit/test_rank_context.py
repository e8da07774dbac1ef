"""The rank's context (installed by the worker) and the wrappers that read it."""

from __future__ import annotations

import pickle
from collections.abc import Iterator

import pytest
import torch

from nbddp.rank import context
from nbddp.rank.context import WithRank
from nbddp.wire.protocol import Placement

RANK2 = Placement(rank=2, local_rank=0, world_size=4, device="cpu")


@pytest.fixture(autouse=True)
def _uninstall() -> Iterator[None]:
    yield
    context.install(None)


def test_outside_a_rank_there_is_no_context() -> None:
    assert context.current() is None
    with pytest.raises(RuntimeError, match="not inside a rank launched by nbddp"):
        context.require()


def test_the_installed_placement_is_the_context() -> None:
    context.install(RANK2)
    assert context.current() is RANK2 and context.require() is RANK2


def test_the_device_is_the_ranks_gpu_or_the_cpu() -> None:
    gpu = Placement(rank=1, local_rank=1, world_size=2, device="cuda", cuda_index=1)
    assert context.device(gpu) == torch.device("cuda", 1)
    assert context.device(RANK2) == torch.device("cpu")
    inherit = Placement(rank=0, local_rank=0, world_size=1, device="inherit")
    assert context.device(inherit) == torch.device("cpu")


def seen(rank: int, *args: object) -> tuple[object, ...]:
    return (rank, *args)


def test_with_rank_passes_the_contexts_rank_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "9")  # the environment is the user's: not read
    context.install(RANK2)
    wrapped = pickle.loads(pickle.dumps(WithRank(seen)))  # as a rank receives it
    assert wrapped("a", 1) == (2, "a", 1)
