"""Cluster benchmark: launch time and print-to-notebook latency across two Ray nodes.

Run by hand (not collected by pytest)::

    python tests/bench/cluster.py [--warm 10] [--lines 80]

On a local two-node Ray cluster (``ray.cluster_utils.Cluster``: head on
127.0.0.2, a worker node on 127.0.0.3, one CPU and two fake GPUs each, as
``tests/cluster`` uses), in one run:

(a) Launch time: ``nbddp.launch`` of a function that returns at once, one rank
per node, from the call until rank 0's value is back. Cold: the first launch
of this process (connecting to the cluster, the placement group, the agents,
each node's forkserver importing torch). Warm: the launches after it (the kept
agents, their forkservers and pools); min, median and max of ``--warm``.

(b) Output latency: 2 ranks per node (4 in all) each print ``--lines`` lines,
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
import os
import statistics
import subprocess
import sys
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
    take = client.ClusterJob._take

    def timed_take(self: client.ClusterJob, node: Any, batch: Any) -> None:
        now = time.time()
        for event in batch.events:
            if isinstance(event, Text):
                delays.extend(now - float(w[1]) for w in _stamps(event.text))
        take(self, node, batch)

    client.ClusterJob._take = timed_take  # type: ignore[method-assign]
    try:
        nbddp.launch(timed_lines, lines, nodes=2, procs=2, cluster=address, output="none")
    finally:
        client.ClusterJob._take = take  # type: ignore[method-assign]
    return delays


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
    args = parser.parse_args()
    from ray.cluster_utils import Cluster

    node = {"num_cpus": 1, "num_gpus": 2, "include_dashboard": False}
    cluster = Cluster(initialize_head=True, head_node_args={"node_ip_address": HEAD, **node})
    try:
        cluster.add_node(node_ip_address=WORKER, **node)
        cluster.wait_for_nodes()
        address = cluster.address
        cold, warm = launch_times(address, args.warm)
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
    print("print-to-notebook latency, 4 ranks on 2 nodes, a line every 25 ms each:")
    print(f"  nbddp (long poll)           {stats(ours)}")
    print(f"  Ray log_to_driver (dedup off) {stats(theirs)}")
    ratio = sorted(theirs)[int(0.95 * len(theirs))] / sorted(ours)[int(0.95 * len(ours))]
    print(f"  p95 ratio Ray / nbddp: {ratio:.1f}x")


if __name__ == "__main__":
    main()
