"""A CUDA tensor back in the notebook: nbddp against torch.multiprocessing, in one run.

    python3 tests/bench/cuda_return.py [--gib 1] [--rounds 3] [--json PATH]

One GPU rank fills a tensor of ``--gib`` GiB on its GPU and returns it; the
notebook gets it on the CPU. Each launcher runs the same function twice per
round, returning the tensor and returning None, and the difference is the
time the tensor took to come back. Beside it: the floor (the rank's own
``tensor.cpu()``, timed in the rank) and torch.multiprocessing's way (a
spawned child puts ``tensor.cpu()`` on a queue, the parent takes it). The
rounds alternate the launchers. ``--json`` also writes the table (``benchjson``).
Not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time


def fill(n: int, back: bool) -> object:
    """A tensor of ``n`` float32 ones made on the GPU, returned or not."""
    import torch

    tensor = torch.ones(n, device="cuda")
    torch.cuda.synchronize()
    return tensor if back else None


def floor(n: int) -> float:
    """Seconds for one ``cpu()`` of such a tensor, in the process that made it."""
    import torch

    tensor = torch.ones(n, device="cuda")
    torch.cuda.synchronize()
    start = time.perf_counter()
    tensor.cpu()
    return time.perf_counter() - start


def _child(n: int, back: bool, queue: object, taken: object) -> None:
    queue.put(fill(n, back).cpu() if back else None)  # type: ignore[attr-defined,union-attr]
    taken.wait()  # type: ignore[attr-defined]  # the parent fetches the memory from this process


def under_mp(n: int, back: bool) -> tuple[float, object]:
    """Seconds for a spawned child to hand its value back over a queue."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue, taken = ctx.SimpleQueue(), ctx.Event()
    start = time.perf_counter()
    child = ctx.Process(target=_child, args=(n, back, queue, taken))
    child.start()
    value = queue.get()
    taken.set()
    child.join()
    return time.perf_counter() - start, value


def under_nbddp(n: int, back: bool) -> tuple[float, object]:
    """Seconds for ``nbddp.launch`` on one GPU to hand its value back."""
    import nbddp

    start = time.perf_counter()
    value = nbddp.launch(fill, n, back, gpus=1, output="none")
    return time.perf_counter() - start, value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", metavar="PATH", help="also write the figures there as JSON")
    args = parser.parse_args()
    import nbddp

    n = int(args.gib * (1 << 30)) // 4
    nbddp.launch(fill, 1024, False, gpus=1, output="none")  # the forkserver up, as in a notebook
    rows: list[tuple[float, float, float]] = []
    for _ in range(args.rounds):
        times = []
        for launcher in (under_nbddp, under_mp):
            empty, _ = launcher(n, False)
            full, value = launcher(n, True)
            if getattr(value, "device", None) is None or value.device.type != "cpu":  # type: ignore[attr-defined]
                sys.exit(f"{launcher.__name__} gave back {type(value).__name__}, not a CPU tensor")
            times.append(full - empty)
        times.append(nbddp.launch(floor, n, gpus=1, output="none"))
        rows.append((times[0], times[1], times[2]))
    print(
        f"\nseconds for a {args.gib:g} GiB CUDA tensor to come back "
        "(the run returning it minus the run returning None)"
    )
    print(f"{'round':>6} {'nbddp':>8} {'torch.mp':>9} {'floor':>7} {'nbddp x floor':>14}")
    for i, (ours, theirs, least) in enumerate(rows, 1):
        print(f"{i:>6} {ours:>8.3f} {theirs:>9.3f} {least:>7.3f} {ours / least:>14.2f}")
    med = [statistics.median(r[k] for r in rows) for k in range(3)]
    print(f"{'median':>6} {med[0]:>8.3f} {med[1]:>9.3f} {med[2]:>7.3f} {med[0] / med[2]:>14.2f}")
    print(
        f"\nnbddp / torch.mp (median): {med[0] / med[1]:.2f}x; "
        f"nbddp / floor: {med[0] / med[2]:.2f}x"
    )
    if args.json:
        import benchjson

        columns = ("round", "nbddp (s)", "torch.mp (s)", "floor (s)", "nbddp x floor")
        table = [[str(i), *r, r[0] / r[2]] for i, r in enumerate(rows, 1)]
        table.append(["median", *med, med[0] / med[2]])
        title = f"a {args.gib:g} GiB CUDA tensor back on the CPU, 1 GPU rank"
        benchjson.write(args.json, "cuda_return", [benchjson.table("back", title, columns, table)])


if __name__ == "__main__":
    main()
