"""Training step rate: the same DDP script under nbddp and under torchrun, in one run.

    python3 tests/bench/gpu_step.py [--gpus N] [--steps 200] [--warmup 30] [--rounds 3] [--json P]
    python3 tests/bench/gpu_step.py --cpu 2   # the same comparison on gloo CPU ranks

The script (``train`` below, written to a file so torchrun runs exactly the
same code) builds a transformer encoder from a config (no download),
wraps it in DDP on nccl, feeds a fixed synthetic batch that lives on the
GPU, runs ``--warmup`` steps and then times ``--steps`` steps between two
``cuda.synchronize()`` calls on every rank. Each launcher reports rank 0's
steps per second; the rounds alternate nbddp and torchrun, so drift in the
machine touches both alike. The table shows each round, the medians and
nbddp's median as a ratio of torchrun's. What is compared is the training
loop once it runs, not the start-up (see ``launch.py`` for that). ``--json``
also writes the table (``benchjson``). Not a test: nothing here asserts a rate.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from types import ModuleType

SCRIPT = textwrap.dedent(
    '''\
    """One DDP training loop; prints and returns rank 0's steps per second."""
    import os
    import sys
    import time

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP


    def train(steps: int, warmup: int, cpu: bool) -> float:
        dist.init_process_group("gloo" if cpu else "nccl")
        rank = dist.get_rank()
        device = torch.device("cpu" if cpu else f"cuda:{int(os.environ['LOCAL_RANK'])}")
        if not cpu:
            torch.cuda.set_device(device)
        width, layers, batch, seq = (64, 2, 8, 16) if cpu else (1024, 8, 32, 256)
        torch.manual_seed(0)
        layer = torch.nn.TransformerEncoderLayer(width, 16 if not cpu else 4, batch_first=True)
        model = DDP(torch.nn.TransformerEncoder(layer, layers).to(device))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        x = torch.randn(batch, seq, width, device=device)

        def step() -> None:
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=not cpu):
                loss = model(x).float().pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        for _ in range(warmup):
            step()
        sync = (lambda: None) if cpu else torch.cuda.synchronize
        sync()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(steps):
            step()
        sync()
        rate = steps / (time.perf_counter() - start)
        dist.destroy_process_group()
        if rank == 0:
            print(f"steps/s {rate:.3f}", flush=True)
        return rate


    if __name__ == "__main__":
        train(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "cpu")
    '''
)


def _load(path: Path) -> ModuleType:
    # Imported by its file's name, from a directory on sys.path: the ranks
    # (which get the notebook's sys.path) unpickle ``train`` from the same file.
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def under_torchrun(script: Path, ranks: int, args: argparse.Namespace) -> float:
    """Rank 0's steps per second under ``torchrun --nproc-per-node``."""
    mode = "cpu" if args.cpu else "gpu"
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={ranks}"]
    command += [str(script), str(args.steps), str(args.warmup), mode]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    found = re.search(r"steps/s ([\d.]+)", done.stdout)
    if found is None:
        raise RuntimeError(f"torchrun printed no rate:\n{done.stdout}\n{done.stderr}")
    return float(found.group(1))


def under_nbddp(module: ModuleType, ranks: int, args: argparse.Namespace) -> float:
    """Rank 0's steps per second under ``nbddp.launch``."""
    import nbddp

    placement = {"procs": ranks} if args.cpu else {"gpus": ranks}
    return float(
        nbddp.launch(
            module.train, args.steps, args.warmup, bool(args.cpu), output="none", **placement
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gpus", type=int, default=None, help="default: every visible GPU")
    parser.add_argument("--cpu", type=int, default=None, help="CPU ranks on gloo instead")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", metavar="PATH", help="also write the figures there as JSON")
    args = parser.parse_args()
    if args.cpu is None:
        import torch

        ranks = args.gpus or torch.cuda.device_count()
        if ranks < 1:
            sys.exit("no CUDA GPU visible: run with --cpu N to compare on CPU ranks")
        # The count above initialised CUDA in this process: nbddp's default start
        # (the forkserver, a fresh process) is unaffected.
    else:
        ranks = args.cpu
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "ddp_train.py"
        script.write_text(SCRIPT)
        sys.path.insert(0, tmp)
        module = _load(script)
        rows: list[tuple[float, float]] = []
        for _ in range(args.rounds):
            rows.append((under_nbddp(module, ranks, args), under_torchrun(script, ranks, args)))
    where = f"{ranks} CPU ranks (gloo)" if args.cpu else f"{ranks} GPUs (nccl, bf16 autocast)"
    print(f"\nsteps/s of rank 0, {where}, {args.steps} timed steps after {args.warmup}")
    print(f"{'round':>5} {'nbddp':>10} {'torchrun':>10} {'ratio':>7}")
    for i, (ours, theirs) in enumerate(rows, 1):
        print(f"{i:>5} {ours:>10.2f} {theirs:>10.2f} {ours / theirs:>7.3f}")
    ours = statistics.median(r[0] for r in rows)
    theirs = statistics.median(r[1] for r in rows)
    print(f"{'median':>5} {ours:>10.2f} {theirs:>10.2f} {ours / theirs:>7.3f}")
    print(f"\nnbddp / torchrun (median steps/s): {ours / theirs:.3f}x")
    if args.json:
        import benchjson

        columns = ("round", "nbddp (steps per second)", "torchrun (steps per second)", "ratio")
        table = [[str(i), a, b, a / b] for i, (a, b) in enumerate(rows, 1)]
        table.append(["median", ours, theirs, ours / theirs])
        title = f"steps/s of rank 0, {where}"
        benchjson.write(args.json, "gpu_step", [benchjson.table("steps", title, columns, table)])


if __name__ == "__main__":
    main()
