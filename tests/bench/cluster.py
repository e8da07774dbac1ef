"""Cluster benchmark: launch time, a large argument and print-to-notebook latency across
two Ray nodes, each beside Ray doing the same (plain Ray; for launches Ray Train too).

Run by hand (not collected by pytest)::

    python tests/bench/cluster.py [--warm 10] [--lines 80] [--repeat 3]

Ray Train's ``TorchTrainer`` (in (b)) needs ``ray[train]``'s extras, which the
project venv does not have; install them into a directory of their own, never
into the venv, and put it on ``PYTHONPATH`` after the project::

    .venv/bin/pip install --no-deps --target /tmp/raytrain \\
        -r tests/bench/requirements-train.txt
    PYTHONPATH=$PWD:/tmp/raytrain .venv/bin/python tests/bench/cluster.py

Without them that variant is skipped, with the reason printed; the rest runs.

On a local two-node Ray cluster (``ray.cluster_utils.Cluster``: head on
127.0.0.2, a worker node on 127.0.0.3, one CPU and two fake GPUs each, as
``tests/cluster`` uses, and a 1 GiB object store each), in one run:

(a) Launch time: ``nbddp.launch`` of a function that returns at once, one rank
per node, from the call until rank 0's value is back. Cold: the first launch
of this process (connecting to the cluster, the placement group, the agents,
each node's forkserver importing torch). Warm: the launches after it (the kept
agents, their forkservers and pools); min, median and max of ``--warm``.

(b) Cold launch beside Ray: nbddp's "cold agents" launch, connected to the
cluster, no agents held (new agents, forkservers, torch imports), after
``nbddp.cluster.release()``; beside it, on the same nodes, the same function
run by Ray Train's ``TorchTrainer`` (``ScalingConfig(num_workers=2,
use_gpu=False)``, one CPU per worker, ``STRICT_SPREAD``: one worker per node;
its workers join one gloo group, then ``train_loop_per_worker`` runs the
function), and by plain Ray doing what those workers do: a placement
group of one CPU bundle per node, one actor per node, each importing torch and
joining one gloo group (``MASTER_ADDR`` of actor 0), then running the
function. Each from the call until rank 0's value is back (for
``TorchTrainer``, which gives back no value, until ``fit`` returns);
``--repeat`` of each, median, and the ratios nbddp / each.

(c) A large argument across nodes, for each ``--mb`` size (200 MB and 1 GiB):
a warm launch whose function gets a float32 tensor of that size and returns
its sum, one rank per node, less a warm launch of a function that returns at
once; beside it the same tensor through ``ray.put``
and ``ray.get`` in warm actors on both nodes (the worker node's copy crosses
the nodes), from the put until both sums are back. Each after one untimed
round with the tensor; median of ``--repeat``. And in a session: a cell
reading the tensor that an earlier cell read (the nodes hold it, unchanged),
after a cell reading nothing, beside that cell.

(d) Output latency: 2 ranks per node (4 in all) each print ``--lines`` lines,
one every 25 ms, each carrying ``time.time()`` when it was printed. Through
nbddp: the time each line reaches the notebook process (the run's event
stream, before the display's own ~10 Hz redraw). Through Ray's
``log_to_driver`` (de-duplication off, its best case): the same function in 4
Ray actors on the same nodes, each line timed when it reaches the driver's
stdout (a separate driver process; its stdout read here as it comes). One
machine, one clock: the differences are the latencies. Median, p95 and max.
"""

from __future__ import annotations

import argparse
import math
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import nbddp
from nbddp.cluster import client
from nbddp.launcher.events import Text

HEAD, WORKER = "127.0.0.2", "127.0.0.3"


def nothing() -> int:
    return 0


def timed_lines(lines: int) -> None:
    """Print ``lines`` lines 25 ms apart, each with the time it was printed."""
    for i in range(lines):
        print(f"LAT {time.time():.6f} {i}", flush=True)
        time.sleep(0.025)


def stats(values: list[float]) -> str:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
    return (
        f"median {statistics.median(ordered) * 1e3:6.1f} ms   p95 {p95 * 1e3:6.1f} ms   "
        f"max {ordered[-1] * 1e3:6.1f} ms   ({len(ordered)} lines)"
    )


def total(weights: Any) -> float:
    """The sum of a large tensor argument."""
    return float(weights.sum())


def wait_until_free() -> None:
    """Until both nodes' CPUs are free again (a handed-back group goes asynchronously)."""
    import ray

    deadline = time.monotonic() + 60
    while ray.available_resources().get("CPU", 0) < 2:
        assert time.monotonic() < deadline, "the nodes' CPUs were not handed back"
        time.sleep(0.1)


def cold_agents_launch(address: str) -> float:
    """A launch with no agents held (connected already): new agents, new forkservers."""
    nbddp.cluster.release()
    wait_until_free()
    started = time.perf_counter()
    nbddp.launch(nothing, nodes=2, procs=1, cluster=address, output="none")
    took = time.perf_counter() - started
    nbddp.cluster.release()
    return took


class TorchWorker:
    """What a Ray Train worker does before the user's function: torch, one gloo group."""

    def address(self) -> str:
        from ray.util import get_node_ip_address

        return str(get_node_ip_address())

    def free_port(self) -> int:
        """A port free on this node now, for the group's store (as Ray Train picks it)."""
        with socket.socket() as sock:
            sock.bind((self.address(), 0))
            return int(sock.getsockname()[1])

    def run(self, rank: int, world: int, master: str, port: int) -> int:
        import torch.distributed as dist

        os.environ.update(MASTER_ADDR=master, MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
        try:
            return nothing()
        finally:
            dist.destroy_process_group()

    def total(self, weights: Any) -> float:
        return total(weights)


def ray_cold_launch() -> float:
    """Plain Ray doing what TorchTrainer's workers do (module docstring, (b))."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    wait_until_free()
    started = time.perf_counter()
    group = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="STRICT_SPREAD")
    ray.get(group.ready())
    actor = ray.remote(TorchWorker)
    workers = [
        actor.options(
            num_cpus=1,
            scheduling_strategy=PlacementGroupSchedulingStrategy(group, i),
        ).remote()
        for i in range(2)
    ]
    # A port picked now, not a fixed one: another run on this machine may hold that.
    master, port = ray.get([workers[0].address.remote(), workers[0].free_port.remote()])
    value = ray.get([w.run.remote(i, 2, master, port) for i, w in enumerate(workers)])[0]
    took = time.perf_counter() - started
    assert value == 0
    for w in workers:
        ray.kill(w)
    remove_placement_group(group)
    return took


def torchtrainer_missing() -> str | None:
    """Why Ray Train's ``TorchTrainer`` cannot be imported here, or None when it can."""
    try:
        from ray.train import ScalingConfig  # noqa: F401
        from ray.train.torch import TorchTrainer  # noqa: F401
    except ImportError as exc:  # ray[train]'s extras (tests/bench/requirements-train.txt)
        return f"{type(exc).__name__}: {exc}"
    return None


def train_loop_per_worker() -> None:
    """A TorchTrainer worker's loop: its gloo group is joined already; the same function."""
    assert nothing() == 0


def torchtrainer_cold_launch(storage: str) -> float:
    """Ray Train's ``TorchTrainer``, 2 workers one per node, from the call until ``fit`` returns.

    ``fit`` gives back no return value (its metrics come only with a checkpoint), so
    the end is the run finished on both workers, without error.
    """
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    wait_until_free()
    started = time.perf_counter()
    trainer = TorchTrainer(
        train_loop_per_worker,
        scaling_config=ScalingConfig(
            num_workers=2,
            use_gpu=False,
            resources_per_worker={"CPU": 1},
            placement_strategy="STRICT_SPREAD",  # one worker per node, as nbddp's ranks
        ),
        run_config=RunConfig(storage_path=storage),
    )
    result = trainer.fit()
    took = time.perf_counter() - started
    assert result.error is None, result.error
    return took


def nbddp_large_argument(address: str, weights: Any, repeat: int) -> list[float]:
    """Seconds a warm launch spends on ``weights`` (a launch with it, less one without)."""
    # Untimed, as for Ray below: the object store's first use of this much memory
    # (page faults) is not what either is measured for.
    nbddp.launch(total, weights, nodes=2, procs=1, cluster=address, output="none")
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        nbddp.launch(nothing, nodes=2, procs=1, cluster=address, output="none")
        empty = time.perf_counter() - started
        started = time.perf_counter()
        value = nbddp.launch(total, weights, nodes=2, procs=1, cluster=address, output="none")
        times.append(time.perf_counter() - started - empty)
        assert math.isclose(value, float(weights.sum()), rel_tol=1e-4)
    return times


def ray_large_argument(weights: Any, repeat: int) -> list[float]:
    """The same tensor through ray.put and ray.get in warm actors on both nodes."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    wait_until_free()
    group = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="STRICT_SPREAD")
    ray.get(group.ready())
    actor = ray.remote(TorchWorker)
    workers = [
        actor.options(
            num_cpus=1, scheduling_strategy=PlacementGroupSchedulingStrategy(group, i)
        ).remote()
        for i in range(2)
    ]
    ray.get([w.address.remote() for w in workers])
    ray.get([w.total.remote(weights) for w in workers])  # untimed: warm, as for nbddp
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        ref = ray.put(weights)
        sums = ray.get([w.total.remote(ref) for w in workers])
        times.append(time.perf_counter() - started)
        assert math.isclose(sums[1], float(weights.sum()), rel_tol=1e-4)
        del ref
    for w in workers:
        ray.kill(w)
    remove_placement_group(group)
    return times


def nbddp_session_cells(address: str, weights: Any, repeat: int) -> tuple[list[float], list[float]]:
    """Seconds of a session cell reading ``weights``, which a cell two before read too (the
    nodes hold it), and of the cell between, which reads nothing."""
    same, empty = [], []
    with nbddp.session(nodes=2, procs=1, cluster=address, output="none") as session:
        session.run(total, weights)  # the first cell with it: it travels
        for _ in range(repeat):
            started = time.perf_counter()
            session.run(nothing)
            empty.append(time.perf_counter() - started)
            started = time.perf_counter()
            value = session.run(total, weights)
            same.append(time.perf_counter() - started)
            assert math.isclose(value, float(weights.sum()), rel_tol=1e-4)
    return same, empty


def launch_times(address: str, warm: int) -> tuple[float, list[float]]:
    started = time.perf_counter()
    nbddp.launch(nothing, nodes=2, procs=1, cluster=address, output="none")
    cold = time.perf_counter() - started
    times = []
    for _ in range(warm):
        started = time.perf_counter()
        nbddp.launch(nothing, nodes=2, procs=1, cluster=address, output="none")
        times.append(time.perf_counter() - started)
    return cold, times


def nbddp_latencies(address: str, lines: int) -> list[float]:
    """Each line's delay from its print to the notebook's event stream."""
    delays: list[float] = []
    take = client.ClusterJob.take

    def timed_take(self: client.ClusterJob, node: Any, batch: Any) -> None:
        now = time.time()
        for event in batch.events:
            if isinstance(event, Text):
                delays.extend(now - float(w[1]) for w in _stamps(event.text))
        take(self, node, batch)

    client.ClusterJob.take = timed_take  # type: ignore[method-assign]
    try:
        nbddp.launch(timed_lines, lines, nodes=2, procs=2, cluster=address, output="none")
    finally:
        client.ClusterJob.take = take  # type: ignore[method-assign]
    return delays


def _all(values: list[float]) -> str:
    return "(" + ", ".join(f"{v:.2f}" for v in values) + ")"


def _stamps(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines() if line.startswith("LAT ")]


RAY_DRIVER = """
import sys, time, ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
sys.path.insert(0, sys.argv[3])
from tests.bench.cluster import timed_lines
ray.init(address=sys.argv[1], log_to_driver=True)
lines = int(sys.argv[2])

@ray.remote(num_cpus=0)
class Rank:
    def run(self, lines):
        timed_lines(lines)

nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
ranks = [
    Rank.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote()
    for node in nodes for _ in range(2)
]
ray.get([r.__ray_ready__.remote() for r in ranks])
ray.get([r.run.remote(lines) for r in ranks])
time.sleep(3)  # the last lines' way to the driver
print("DONE", flush=True)
"""


def ray_latencies(address: str, lines: int) -> list[float]:
    """The same lines through Ray's log_to_driver, timed at the driver's stdout."""
    env = {**os.environ, "RAY_DEDUP_LOGS": "0", "PYTHONUNBUFFERED": "1"}
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(RAY_DRIVER), address, str(lines), root],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    delays = []
    timer = threading.Timer(300, proc.kill)
    timer.start()
    for line in proc.stdout:
        now = time.time()
        _, sep, rest = line.partition("LAT ")
        if sep:
            delays.append(now - float(rest.split()[0]))
        if line.startswith("DONE"):
            break
    timer.cancel()
    proc.wait()
    return delays


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--warm", type=int, default=10)
    parser.add_argument("--lines", type=int, default=80)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--mb", type=int, nargs="+", default=[200, 1024], help="argument sizes")
    parser.add_argument("--json", help="also write the figures to this file (benchjson)")
    args = parser.parse_args()
    import torch

    sizes = {mb: torch.rand(mb * 1024 * 1024 // 4) for mb in args.mb}  # float32
    from ray.cluster_utils import Cluster

    # An object store per node of twice the largest tensor: Ray's default here (about
    # 150 MB a node on this machine) is smaller, and both sides would measure spilling.
    node = {
        "num_cpus": 1,
        "num_gpus": 2,
        "include_dashboard": False,
        "object_store_memory": max(1 << 30, 2 * max(args.mb) << 20),
    }
    cluster = Cluster(initialize_head=True, head_node_args={"node_ip_address": HEAD, **node})
    try:
        cluster.add_node(node_ip_address=WORKER, **node)
        cluster.wait_for_nodes()
        address = cluster.address
        cold, warm = launch_times(address, args.warm)
        big_ours = {mb: nbddp_large_argument(address, w, args.repeat) for mb, w in sizes.items()}
        cells = {mb: nbddp_session_cells(address, w, args.repeat) for mb, w in sizes.items()}
        cold_ours = [cold_agents_launch(address) for _ in range(args.repeat)]
        cold_ray = [ray_cold_launch() for _ in range(args.repeat)]
        missing = torchtrainer_missing()
        cold_train: list[float] = []
        if missing is None:
            with tempfile.TemporaryDirectory() as storage:
                cold_train = [torchtrainer_cold_launch(storage) for _ in range(args.repeat)]
        big_ray = {mb: ray_large_argument(w, args.repeat) for mb, w in sizes.items()}
        ours = nbddp_latencies(address, args.lines)
        nbddp.cluster.release()  # the nodes' CPUs go to the other driver
        theirs = ray_latencies(address, args.lines)
    finally:
        import ray

        nbddp.cluster.release()
        ray.shutdown()
        cluster.shutdown()
    print("launch, 1 rank per node on 2 nodes (call to rank 0's value):")
    print(f"  cold   {cold:6.2f} s")
    print(
        f"  warm   min {min(warm):.3f} s   median {statistics.median(warm):.3f} s   "
        f"max {max(warm):.3f} s   ({len(warm)} launches)"
    )
    median = statistics.median
    print("cold launch, no agents held, connected (call to rank 0's value; median):")
    print(f"  nbddp                          {median(cold_ours):6.2f} s   {_all(cold_ours)}")
    print(f"  plain Ray (TorchTrainer's way)  {median(cold_ray):6.2f} s   {_all(cold_ray)}")
    if cold_train:
        print(f"  Ray Train TorchTrainer          {median(cold_train):6.2f} s   {_all(cold_train)}")
    else:
        print(f"  Ray Train TorchTrainer          skipped, not importable ({missing})")
    print(f"  ratio nbddp / plain Ray: {median(cold_ours) / median(cold_ray):.2f}x")
    if cold_train:
        print(f"  ratio nbddp / TorchTrainer: {median(cold_ours) / median(cold_train):.2f}x")
    for mb in sizes:
        ours_mb, ray_mb, (same, empty) = big_ours[mb], big_ray[mb], cells[mb]
        print(f"{mb} MB float32 tensor to one rank on each of 2 nodes (median):")
        print(f"  nbddp launch argument          {median(ours_mb):6.2f} s   {_all(ours_mb)}")
        print(f"  ray.put + ray.get in actors     {median(ray_mb):6.2f} s   {_all(ray_mb)}")
        print(f"  ratio Ray / nbddp: {median(ray_mb) / median(ours_mb):.2f}x")
        print(f"  session cell reading it again   {median(same):6.3f} s   {_all(same)}")
        print(f"  session cell reading nothing    {median(empty):6.3f} s   {_all(empty)}")
    print("print-to-notebook latency, 4 ranks on 2 nodes, a line every 25 ms each:")
    print(f"  nbddp (long poll)           {stats(ours)}")
    print(f"  Ray log_to_driver (dedup off) {stats(theirs)}")
    ratio = sorted(theirs)[int(0.95 * len(theirs))] / sorted(ours)[int(0.95 * len(ours))]
    print(f"  p95 ratio Ray / nbddp: {ratio:.1f}x")
    if args.json:
        import benchjson

        columns = ("variant", "median (s)", "min (s)", "max (s)", "n", "/ plain Ray")
        launches = [("nbddp cold (new agents)", cold_ours), ("plain Ray", cold_ray)]
        launches += [("Ray Train TorchTrainer", cold_train)] if cold_train else []
        launches += [("nbddp warm (kept agents)", warm)]
        base = median(cold_ray)
        tables = [
            benchjson.table(
                "cold",
                "launch, 1 rank per node on 2 Ray nodes (call to rank 0's value)",
                columns,
                [(n, median(t), min(t), max(t), len(t), median(t) / base) for n, t in launches],
            ),
        ]
        for mb in sizes:
            variants = [
                ("nbddp argument", big_ours[mb]),
                ("ray.put + ray.get", big_ray[mb]),
                ("nbddp session cell reading it again", cells[mb][0]),
                ("nbddp session cell reading nothing", cells[mb][1]),
            ]
            tables.append(
                benchjson.table(
                    "argument" if mb == 200 else f"argument {mb} MB",
                    f"{mb} MB float32 tensor to one rank on each of 2 nodes",
                    ("variant", "median (s)", "min (s)", "max (s)", "n"),
                    [(n, median(t), min(t), max(t), len(t)) for n, t in variants],
                )
            )
        notes = [f"first launch of the process (connect, agents, forkservers): {cold:.2f} s"]
        benchjson.write(args.json, "cluster", tables, notes)


if __name__ == "__main__":
    main()
