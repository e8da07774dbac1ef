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
    first = torch.nn.Linear(32, 64)
    model = torch.nn.Sequential(first, torch.nn.ReLU(), torch.nn.Linear(64, 1))
    # What a layer computes in: the model's own output is cast back to float32 by
    # Accelerate (``convert_outputs_to_fp32``), so it cannot tell.
    computed: list[str] = []
    first.register_forward_hook(lambda _mod, _args, out: computed.append(str(out.dtype)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = torch.randn(256, 32), torch.randn(256, 1)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32)
    model, opt, data = acc.prepare(model, opt, data)
    losses = []
    for _ in range(5):
        for xb, yb in data:
            with acc.autocast():
                out = model(xb)
                loss = torch.nn.functional.mse_loss(out.float(), yb)
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
            losses.append(float(loss.item()))
    return {
        "device": str(acc.device),
        "num_processes": acc.num_processes,
        "mixed_precision": acc.mixed_precision,
        "autocast_dtype": computed[-1],
        "first_loss": losses[0],
        "last_loss": losses[-1],
    }


def fsdp2_nccl_train(steps: int) -> list[dict[str, Any]]:
    """FSDP2 (``fully_shard``) on an nccl group, each rank on its own GPU and half of
    each batch; every rank's parameter placements, shards and full weights."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("nccl")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    x, y = fsdp2_data()
    model = fsdp2_model().to(device)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    shards = {
        name: (type(p).__name__, str(p.placements), tuple(p.to_local().shape))
        for name, p in model.named_parameters()
    }
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(steps):
        out = model(x[rank::world_size].to(device))
        torch.nn.functional.mse_loss(out, y[rank::world_size].to(device)).backward()
        opt.step()
        opt.zero_grad()
    seen = {
        "rank": rank,
        "world_size": world_size,
        "device": str(next(model.parameters()).to_local().device),
        "shards": shards,
        "full": {name: p.full_tensor().cpu() for name, p in model.named_parameters()},
    }
    every: list[Any] = [None] * world_size
    dist.all_gather_object(every, seen)
    dist.destroy_process_group()
    return every


def fsdp2_data() -> tuple[Any, Any]:
    import torch

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(64, 16, generator=generator)
    return x, x[:, :4] * 2 - x[:, 4:8]


def fsdp2_model() -> Any:
    """The model of ``fsdp2_nccl_train``: every dimension splits evenly over 1, 2, 4 or 8 GPUs."""
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))


def accelerate_deepspeed_train() -> dict[str, Any]:
    """DeepSpeed ZeRO stage 2 through Accelerate: a few steps on each rank's GPU, and
    what Accelerate and DeepSpeed saw (every rank's weights, gathered)."""
    import torch
    import torch.distributed as dist
    from accelerate import Accelerator
    from accelerate.utils import DeepSpeedPlugin

    acc = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = torch.randn(256, 32), torch.randn(256, 1)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)
    model, opt, data = acc.prepare(model, opt, data)
    losses = []
    for _ in range(3):
        for xb, yb in data:
            loss = torch.nn.functional.mse_loss(model(xb).float(), yb.float())
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
            losses.append(float(loss.item()))
    flat = torch.cat([p.detach().float().reshape(-1) for p in model.parameters()])
    every = [torch.empty_like(flat) for _ in range(acc.num_processes)]
    dist.all_gather(every, flat)
    return {
        "distributed_type": acc.distributed_type.value,
        "engine": type(model).__name__,
        "zero_stage": acc.state.deepspeed_plugin.zero_stage,
        "num_processes": acc.num_processes,
        "batches": len(data),
        "same_weights": all(torch.equal(every[0], other) for other in every[1:]),
        "first_loss": losses[0],
        "last_loss": losses[-1],
    }
