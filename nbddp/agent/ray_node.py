"""The agent as a Ray actor: what Ray says of the node it runs on."""

from __future__ import annotations

from collections.abc import Callable

from nbddp.agent.node import NodeAgent


class RayNodeAgent(NodeAgent):
    """A ``NodeAgent`` placed by Ray (``cluster.ray_engine``)."""

    engine = "this node's raylet"  # Ray's worker process outlives a raylet killed under it

    def node_address(self) -> str:
        from ray.util import get_node_ip_address

        address: Callable[[], str] = get_node_ip_address
        return address()

    def gpu_ids(self) -> tuple[str, ...]:
        import ray

        return tuple(str(g) for g in ray.get_gpu_ids())

    def node_id(self) -> str:
        import ray

        return str(ray.get_runtime_context().get_node_id())
