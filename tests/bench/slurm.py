"""Slurm benchmark: launch time inside an allocation, beside what a Slurm user runs today.

Run by hand (not collected by pytest); it starts the tests' two-node Slurm cluster
(``tests/slurm/cluster.sh``: nodes n1 and n2 on this machine) and stops it after::

    python tests/bench/slurm.py [--repeat 5] [--warm 10]

Inside one allocation of both nodes (``salloc -N2``), the same function on one
rank per node (join a gloo group, all-reduce a tensor, return it), each timed
from the call until it is done:

- nbddp cold: ``nbddp.launch(fn, nodes=2, procs=1, cluster="slurm")`` with no
  agents kept (after ``nbddp.cluster.release()``): the agents' step, their
  forkservers importing torch, the ranks. Median of ``--repeat``.
- nbddp warm: the launches after it (the kept agents). Median of ``--warm``.
- srun + torchrun: ``srun --overlap -N2 --ntasks-per-node=1 python -m
  torch.distributed.run --nnodes 2 --nproc-per-node 1 --node-rank
  $SLURM_NODEID ... script.py``, the script running the same function, until
  srun exits. Median of ``--repeat``.

Prints each median and the ratios nbddp / srun + torchrun.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).parents[2]
sys.path.insert(0, str(ROOT))

SCRIPT = ROOT / "tests" / "slurm" / "cluster.sh"
CONF = "/tmp/nbddp-slurm/etc/slurm.conf"

FUNCTION = """
def reduce_once():
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    dist.destroy_process_group()
    return float(t)
"""


def srun_torchrun(job: str, script: Path, port: int) -> float:
    started = time.perf_counter()
    node = (
        f"exec {sys.executable} -m torch.distributed.run --nnodes 2 --nproc-per-node 1 "
        f"--node-rank $SLURM_NODEID --master-addr 127.0.0.1 --master-port {port} {script}"
    )
    subprocess.run(
        ["srun", "--overlap", f"--jobid={job}", "-N2", "--ntasks-per-node=1", "bash", "-c", node],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--warm", type=int, default=10)
    parser.add_argument("--json", help="also write the figures to this file (benchjson)")
    args = parser.parse_args()
    os.environ["SLURM_CONF"] = CONF
    subprocess.run(["bash", str(SCRIPT), "start"], check=True)
    try:
        out = subprocess.run(
            ["salloc", "-N2", "--no-shell"], capture_output=True, text=True, check=True
        )
        job = out.stderr.split("Granted job allocation ")[1].split()[0]
        os.environ["SLURM_JOB_ID"] = job
        run(job, args.repeat, args.warm, args.json)
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop"], check=True)


def run(job: str, repeat: int, warm_count: int, json_path: str | None = None) -> None:
    import nbddp
    import nbddp.cluster

    space: dict[str, object] = {}
    exec(FUNCTION, space)
    fn = space["reduce_once"]
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "reduce.py"
        script.write_text(textwrap.dedent(FUNCTION) + "\nprint(reduce_once())\n")
        srun_times = [srun_torchrun(job, script, 29600 + i) for i in range(repeat)]
    cold, warm = [], []
    for _ in range(repeat):
        nbddp.cluster.release()
        started = time.perf_counter()
        assert nbddp.launch(fn, nodes=2, procs=1, cluster="slurm", output="none") == 2.0
        cold.append(time.perf_counter() - started)
    for _ in range(warm_count):
        started = time.perf_counter()
        nbddp.launch(fn, nodes=2, procs=1, cluster="slurm", output="none")
        warm.append(time.perf_counter() - started)
    nbddp.cluster.release()
    base = statistics.median(srun_times)
    rows = [
        ("srun + torchrun", srun_times),
        ("nbddp cold (new agents)", cold),
        ("nbddp warm (kept agents)", warm),
    ]
    print(f"launch inside a Slurm allocation of 2 nodes, 1 rank per node (job {job})")
    for name, times in rows:
        median = statistics.median(times)
        print(
            f"  {name:26s} median {median:6.3f} s  (min {min(times):.3f}, max {max(times):.3f}, "
            f"n={len(times)})  {median / base:5.2f}x srun + torchrun"
        )
    if json_path:
        import benchjson

        columns = ("launcher", "median (s)", "min (s)", "max (s)", "n", "/ srun + torchrun")
        table = [
            (name, statistics.median(t), min(t), max(t), len(t), statistics.median(t) / base)
            for name, t in rows
        ]
        title = "launch inside a Slurm allocation of 2 nodes, 1 rank per node"
        benchjson.write(json_path, "slurm", [benchjson.table("launch", title, columns, table)], [])


if __name__ == "__main__":
    main()
