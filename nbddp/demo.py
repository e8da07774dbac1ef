"""``python -m nbddp.demo``: a real DDP training run through ``nbddp.launch``.

Trains a small MLP on scikit-learn's bundled digits (no download) with DDP on every visible GPU,
or 2 CPU ranks (gloo). Needs scikit-learn (``pip install 'nbddp[demo]'``). The notebook side
loads the data once and passes tensors; each rank prints and ``nbddp.log``s a line per epoch
(step N is epoch N); the notebook prints the reduced test accuracy last.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

import torch

import nbddp


@dataclass(frozen=True)
class Digits:
    """The digits split into train and test sets: 64 pixels in [0, 1] per row, labels 0-9."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor


def load_data() -> Digits:
    """Load and split the digits (in the notebook process; ranks receive the tensors)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(x / 16.0, y, test_size=0.25, random_state=0)
    return Digits(
        x_train=torch.tensor(x_train, dtype=torch.float32),
        y_train=torch.tensor(y_train),
        x_test=torch.tensor(x_test, dtype=torch.float32),
        y_test=torch.tensor(y_test),
    )


def train(data: Digits, epochs: int, lr: float, batch_size: int) -> dict[str, object]:
    """One rank's training: DDP over a DistributedSampler; returns test metrics."""
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if use_cuda else torch.device("cpu")
    torch.manual_seed(0)

    train_set = TensorDataset(data.x_train, data.y_train)
    sampler: DistributedSampler[tuple[torch.Tensor, ...]] = DistributedSampler(
        train_set, shuffle=True, seed=0
    )
    loader = DataLoader(train_set, batch_size=batch_size, sampler=sampler)

    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).to(device)
    ddp = DDP(model, device_ids=[device.index] if use_cuda else None)
    opt = torch.optim.Adam(ddp.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss()
    start = time.perf_counter()
    for epoch in range(1, epochs + 1):
        sampler.set_epoch(epoch - 1)  # the shuffle the demo has always had
        total, count = torch.zeros(1, device=device), torch.zeros(1, device=device)
        for xb, yb in loader:
            xb, yb = xb.to(device), yb.to(device)
            opt.zero_grad()
            loss = loss_fn(ddp(xb), yb)
            loss.backward()
            opt.step()
            total += loss.detach() * len(yb)
            count += len(yb)
        mean = (total / count).item()
        print(f"epoch {epoch}/{epochs}: train loss {mean:.4f} on {int(count.item())} samples")
        nbddp.log(step=epoch, loss=mean)

    # Each rank scores its shard of the test set; the counts are summed across ranks.
    xt, yt = data.x_test[rank::world].to(device), data.y_test[rank::world].to(device)
    with torch.no_grad():
        correct = (model(xt).argmax(dim=1) == yt).sum().float()
    stats = torch.stack([correct, torch.tensor(float(len(yt)), device=device)])
    dist.all_reduce(stats)
    accuracy = (stats[0] / stats[1]).item()
    elapsed = time.perf_counter() - start
    dist.destroy_process_group()
    return {"accuracy": accuracy, "world_size": world, "seconds": elapsed}


def main(argv: list[str] | None = None) -> int:
    """Parse options, load the data, launch the training, print the final metric."""
    parser = argparse.ArgumentParser(prog="python -m nbddp.demo", description=__doc__)
    parser.add_argument("--gpus", type=int, default=None, help="GPU count (default: all)")
    parser.add_argument("--procs", type=int, default=None, help="CPU processes instead of GPUs")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args(argv)
    try:
        data = load_data()
    except ModuleNotFoundError as missing:
        if missing.name != "sklearn":
            raise
        print("the demo needs scikit-learn: pip install 'nbddp[demo]'", file=sys.stderr)
        return 2
    result = nbddp.launch(
        train, data, args.epochs, args.lr, args.batch_size, gpus=args.gpus, procs=args.procs
    )
    print(
        f"final test accuracy {result['accuracy']:.4f} on {result['world_size']} ranks "
        f"({result['seconds']:.1f}s of training)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
