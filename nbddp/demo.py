"""``python -m nbddp.demo``: a real DDP training run through ``nbddp.launch``.

Trains a small MLP on scikit-learn's bundled handwritten digits (no
download) with ``DistributedDataParallel`` on every visible GPU, or on 2 CPU
ranks (gloo) when there is none. Each rank prints its progress; the
notebook side prints the final test accuracy, reduced across ranks.
Needs scikit-learn (installed by ``.ci/requirements.txt``).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import nbddp


def train(epochs: int, lr: float, batch_size: int) -> dict[str, Any]:
    """One rank's training: DDP over a DistributedSampler; returns test metrics."""
    import torch
    import torch.distributed as dist
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if use_cuda else torch.device("cpu")
    torch.manual_seed(0)

    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(x / 16.0, y, test_size=0.25, random_state=0)
    train_set = TensorDataset(torch.tensor(x_train, dtype=torch.float32), torch.tensor(y_train))
    sampler: DistributedSampler[Any] = DistributedSampler(train_set, shuffle=True, seed=0)
    loader = DataLoader(train_set, batch_size=batch_size, sampler=sampler)

    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).to(device)
    ddp = DDP(model, device_ids=[device.index] if use_cuda else None)
    opt = torch.optim.Adam(ddp.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss()
    start = time.perf_counter()
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        total, count = torch.zeros(1, device=device), torch.zeros(1, device=device)
        for xb, yb in loader:
            xb, yb = xb.to(device), yb.to(device)
            opt.zero_grad()
            loss = loss_fn(ddp(xb), yb)
            loss.backward()
            opt.step()
            total += loss.detach() * len(yb)
            count += len(yb)
        print(
            f"epoch {epoch + 1}/{epochs}: train loss {(total / count).item():.4f} "
            f"on {int(count.item())} samples"
        )
        nbddp.log(step=epoch, loss=(total / count).item())

    # Each rank scores its shard of the test set; the counts are summed across ranks.
    xt = torch.tensor(x_test, dtype=torch.float32)[rank::world].to(device)
    yt = torch.tensor(y_test)[rank::world].to(device)
    with torch.no_grad():
        correct = (model(xt).argmax(dim=1) == yt).sum().float()
    stats = torch.stack([correct, torch.tensor(float(len(yt)), device=device)])
    dist.all_reduce(stats)
    accuracy = (stats[0] / stats[1]).item()
    elapsed = time.perf_counter() - start
    print(f"done in {elapsed:.1f}s; test accuracy {accuracy:.4f} (all ranks)")
    dist.destroy_process_group()
    return {"accuracy": accuracy, "world_size": world, "seconds": elapsed}


def main(argv: list[str] | None = None) -> int:
    """Parse options, launch the training, print the final metric."""
    parser = argparse.ArgumentParser(prog="python -m nbddp.demo", description=__doc__)
    parser.add_argument("--gpus", type=int, default=None, help="GPU count (default: all)")
    parser.add_argument("--procs", type=int, default=None, help="CPU processes instead of GPUs")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args(argv)
    try:
        import sklearn  # noqa: F401 - checked before any process starts
    except ImportError:
        print("the demo needs scikit-learn: pip install scikit-learn", file=sys.stderr)
        return 2
    result = nbddp.launch(
        train, args.epochs, args.lr, args.batch_size, gpus=args.gpus, procs=args.procs
    )
    print(
        f"final test accuracy {result['accuracy']:.4f} on {result['world_size']} ranks "
        f"({result['seconds']:.1f}s of training)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
