"""Frameworks on real GPUs through nbddp: FSDP2 on nccl, DeepSpeed through Accelerate.

Skipped where no CUDA GPU is visible (``conftest.py``); the DeepSpeed test also
where ``deepspeed`` is not installed, and both where fewer than two GPUs are
visible (sharding over one GPU proves nothing). Every test checks that no rank
process is left over.
"""

from __future__ import annotations

import pytest

import nbddp
from tests.gpu import fns


@pytest.fixture
def two_or_more(gpus: int) -> int:
    if gpus < 2:
        pytest.skip("needs two GPUs")
    return gpus


def test_fsdp2_shards_every_parameter_over_an_nccl_group(two_or_more: int) -> None:
    import torch

    gpus, steps = two_or_more, 4
    ranks = nbddp.launch(fns.fsdp2_nccl_train, steps, gpus=gpus, output="none")
    assert [r["rank"] for r in ranks] == list(range(gpus))
    assert all(r["world_size"] == gpus for r in ranks)
    # The same training in this process, on the CPU, on the whole batch.
    x, y = fns.fsdp2_data()
    reference = fns.fsdp2_model()
    opt = torch.optim.SGD(reference.parameters(), lr=0.05)
    for _ in range(steps):
        torch.nn.functional.mse_loss(reference(x), y).backward()
        opt.step()
        opt.zero_grad()
    for rank, r in enumerate(ranks):
        assert r["device"] == f"cuda:{rank}"
        for name, param in reference.named_parameters():
            kind, placements, local_shape = r["shards"][name]
            assert (kind, placements) == ("DTensor", "(Shard(dim=0),)")
            assert local_shape == (param.shape[0] // gpus, *param.shape[1:])
            assert torch.equal(r["full"][name], ranks[0]["full"][name])
            assert torch.allclose(r["full"][name], param.detach(), atol=1e-4), name


def test_deepspeed_zero2_through_accelerate_trains_on_every_gpu(two_or_more: int) -> None:
    pytest.importorskip("accelerate")
    pytest.importorskip("deepspeed")
    seen = nbddp.notebook_launcher(fns.accelerate_deepspeed_train, num_processes=two_or_more)
    assert seen["distributed_type"] == "DEEPSPEED"
    assert seen["engine"] == "DeepSpeedEngine" and seen["zero_stage"] == 2
    assert seen["num_processes"] == two_or_more
    assert seen["batches"] == 256 // 16 // two_or_more  # each rank its share of the data
    assert seen["same_weights"]
    assert seen["last_loss"] < seen["first_loss"]
