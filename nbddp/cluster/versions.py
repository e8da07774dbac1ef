"""The versions a notebook and the nodes it runs on must share, and the check of them.

Contract: ``local_versions()`` names what must match between the notebook and
every node: Python (major.minor: pickled code is tied to it), ray, torch,
cloudpickle and nbddp. ``mismatch(ours, node, where)`` is None when a node has
the same, else a one-line message naming the node and what differs.
"""

from __future__ import annotations

import platform
import sys

VERSIONED = ("python", "ray", "torch", "cloudpickle", "nbddp")


def local_versions() -> dict[str, str]:
    """This process's versions of what must match (a package not installed: ``none``)."""
    found = {"python": ".".join(platform.python_version_tuple()[:2])}
    for name in VERSIONED[1:]:
        module = sys.modules.get(name)
        if module is None:
            try:
                module = __import__(name)
            except ImportError:
                found[name] = "none"
                continue
        found[name] = str(getattr(module, "__version__", "unknown"))
    return found


def mismatch(ours: dict[str, str], theirs: dict[str, str], where: str) -> str | None:
    """One line naming the node and every version that differs, or None."""
    differ = [
        f"{name} {theirs.get(name, 'none')} there, {ours.get(name, 'none')} here"
        for name in VERSIONED
        if theirs.get(name) != ours.get(name)
    ]
    if not differ:
        return None
    return (
        f"node {where} has different versions than this notebook ({'; '.join(differ)}); "
        "install the same versions there (or pass runtime_env with nbddp.RayCluster)"
    )
