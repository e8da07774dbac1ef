"""Runs across machines (``launch(..., nodes=2, cluster=...)``): the notebook's side.

An engine places one agent per node; ``agents`` keeps them, and
``client.ClusterJob`` runs over them. Depends on the launcher, never the
reverse; engines are imported only when a cluster run starts.
"""

from __future__ import annotations

import sys

from nbddp.launcher.clusters import RayCluster, SlurmCluster

__all__ = ["RayCluster", "SlurmCluster", "describe", "release"]


def release() -> None:
    """Hand back the agents kept for the next launch (and what holds their nodes: a
    Ray placement group, an allocation nbddp asked Slurm for, kept ones included).

    The next cluster launch starts new ones (slower: seconds). Does nothing
    when no cluster run was made in this process."""
    agents = sys.modules.get("nbddp.cluster.agents")
    if agents is not None:
        agents.release_agents()
    slurm = sys.modules.get("nbddp.cluster.slurm_engine")
    if slurm is not None:
        slurm.end_kept()


def describe() -> str:
    """What this process holds on its clusters: each set of agents, its nodes, and the
    runs and sessions using it, or when it goes back if idle (a few lines)."""
    from nbddp.cluster import agents

    return agents.describe()
