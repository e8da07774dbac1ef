"""Module-level functions the GPU tests launch (ranks import them by reference)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any


def nccl_view() -> list[dict[str, Any]]:
    """Join an nccl group over every rank's GPU, all_reduce a CUDA tensor, and
    gather what each rank sees of its device."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("nccl")
    rank = dist.get_rank()
    t = torch.ones(4, device="cuda") * (rank + 1)
    dist.all_reduce(t)
    current = torch.cuda.current_device()
    view = {
        "rank": rank,
        "world_size": dist.get_world_size(),
        "local_rank": int(os.environ["LOCAL_RANK"]),
        "current_device": current,
        "tensor_device": str(t.device),
        "sum": t.tolist(),
        "uuid": str(torch.cuda.get_device_properties(current).uuid),
    }
    views: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(views, view)
    dist.destroy_process_group()
    return views


def device_zero() -> dict[str, Any]:
    """What the rank's ``cuda:0`` is."""
    import torch

    return {
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "count": torch.cuda.device_count(),
        "current_device": torch.cuda.current_device(),
        "uuid": str(torch.cuda.get_device_properties(0).uuid),
    }


def cuda_sum() -> float:
    """A computation on the rank's GPU."""
    import torch

    return float(torch.arange(4.0, device="cuda").sum().item())


@dataclass
class Batch:
    """A user's own container, with tensors inside containers inside it."""

    x: Any
    meta: dict[str, Any] = field(default_factory=dict)


def cuda_values() -> dict[str, Any]:
    """CUDA tensors as users return them: bare, in a state_dict, in a dataclass, nested."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2).cuda()
    return {
        "tensor": torch.arange(6.0, device="cuda"),
        "state": model.state_dict(),
        "batch": Batch(
            torch.ones(2, device="cuda"),
            {"nested": [torch.zeros(1, device="cuda"), (torch.tensor(3, device="cuda"),)]},
        ),
    }


def accelerate_bf16_train() -> dict[str, Any]:
    """A few Accelerate training steps in bf16 on the GPU; what it saw and the losses."""
    import torch
    from accelerate import Accelerator

    acc = Accelerator(mixed_precision="bf16")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = torch.randn(256, 32), torch.randn(256, 1)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32)
    model, opt, data = acc.prepare(model, opt, data)
    losses = []
    autocast_dtype = None
    for _ in range(5):
        for xb, yb in data:
            with acc.autocast():
                out = model(xb)
                autocast_dtype = str(out.dtype)
                loss = torch.nn.functional.mse_loss(out.float(), yb)
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
            losses.append(float(loss.item()))
    return {
        "device": str(acc.device),
        "num_processes": acc.num_processes,
        "mixed_precision": acc.mixed_precision,
        "autocast_dtype": autocast_dtype,
        "first_loss": losses[0],
        "last_loss": losses[-1],
    }
