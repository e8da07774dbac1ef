"""Runs across machines on a Ray cluster (``launch(..., nodes=2, cluster=...)``).

Contract: one nbddp agent actor per node (``agent``) runs nbddp's own local
launcher there (forkserver, pool, worker, relay, per-rank process groups);
ranks are not Ray actors. The notebook side (``client.ClusterJob``) is one
more ``launcher.run.RunSource``, so ``Run``, the displays, the failures and
``%%ddp`` work unchanged. Ray is an optional extra (``pip install nbddp[ray]``):
only ``ray_api``, ``client`` and ``agent`` import it, and only when a cluster
run starts; ``import nbddp`` never imports ray. ``spec`` (the ``cluster``
option's value) imports nothing but the standard library.
"""

from nbddp.cluster.spec import RayCluster, release

__all__ = ["RayCluster", "release"]
