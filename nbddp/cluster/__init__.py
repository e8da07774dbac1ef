"""Runs across machines on a Ray cluster (``launch(..., nodes=2, cluster=...)``).

Contract: one nbddp agent actor per node (``agent``) runs nbddp's own local
launcher there (forkserver, pool, worker, relay, per-rank process groups);
ranks are not Ray actors. The notebook side (``client.ClusterJob``) is one
more ``launcher.run.RunSource``, so ``Run``, the displays, the failures and
``%%ddp`` work unchanged. This package depends on the launcher, never the
other way round: the ``cluster`` option's value (``RayCluster``) is the
launcher's. Ray is an optional extra (``pip install nbddp[ray]``), imported
only inside functions, when a cluster run starts.
"""

from __future__ import annotations

import sys

from nbddp.launcher.raycluster import RayCluster

__all__ = ["RayCluster", "describe", "release"]


def release() -> None:
    """Hand back the agents (and their placement group) kept for the next launch.

    The next cluster launch starts new ones (slower: seconds). Does nothing
    when no cluster run was made in this process."""
    client = sys.modules.get("nbddp.cluster.client")
    if client is not None:
        client.release_agents()


def describe() -> str:
    """What this process holds on its clusters: each set of agents, its nodes, and the
    runs and sessions using it, or when it goes back if idle (a few lines)."""
    nodes = sys.modules.get("nbddp.cluster.nodes")
    if nodes is None:
        return "no agents held on any cluster"
    text: str = nodes.describe()
    return text
