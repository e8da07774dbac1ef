"""Sessions on real GPUs: CUDA state kept from cell to cell over nccl, device memory shown,
and a rank blocked in an nccl collective ends the session (nccl waits cannot be freed).

Skipped without CUDA (tests/gpu/conftest.py); see test_gpu.py for how to run it.
"""

from __future__ import annotations

import time

import pytest

import nbddp


def test_a_session_keeps_cuda_tensors_and_its_nccl_group_from_cell_to_cell(gpus: int) -> None:
    with nbddp.session(gpus=gpus, output="none") as s:
        s.exec("import torch, torch.distributed as dist")
        s.exec("w = torch.full((4,), rank + 1.0, device=device)")
        assert s.exec("w.device.type") == "cuda"
        total = s.exec("t = w.clone()\ndist.all_reduce(t)\nt.cpu()")
        assert total.tolist() == [float(sum(range(1, gpus + 1)))] * 4
        assert s.exec("dist.get_backend()") == "nccl"
        row = s.describe().split("\n")[2].split()  # rank, pid, uptime, memory, device, state
        assert row[6] == "MiB", row  # a device figure, not "-"


def test_a_rank_blocked_in_an_nccl_collective_ends_the_session(gpus: int) -> None:
    if gpus < 2:
        pytest.skip("needs two GPUs")
    with nbddp.session(gpus=2, output="none") as s:
        s.exec("import torch, torch.distributed as dist")
        started = time.monotonic()
        with pytest.raises(ValueError, match="before the all_reduce") as info:
            s.exec(
                "if rank == 1: raise ValueError('before the all_reduce')\n"
                "t = torch.ones(1, device=device)\ndist.all_reduce(t)\ntorch.cuda.synchronize()"
            )
        assert time.monotonic() - started < 30
        assert "state is lost" in info.value.__notes__[-1]
        assert not s.alive
