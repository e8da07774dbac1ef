"""The versions a notebook and the nodes it runs on must share, and the check of them.

Contract: ``local_versions()`` names what must match between the notebook and
every node: Python (major.minor: pickled code is tied to it), ray (on Ray),
torch, cloudpickle and nbddp. ``mismatch(ours, node, where)`` is None when a node has
the same, else a one-line message naming the node and what differs.
"""

from __future__ import annotations

import platform
import sys
from importlib import metadata

VERSIONED = ("python", "ray", "torch", "cloudpickle", "nbddp")


def local_versions() -> dict[str, str]:
    """This process's versions of what must match (a package not installed: ``none``).

    Read from the installed packages' metadata, not by importing them: an agent
    answers before it has imported torch (seconds of a cold start)."""
    found = {"python": ".".join(platform.python_version_tuple()[:2])}
    for name in VERSIONED[1:]:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = _imported_version(name)
    return found


def _imported_version(name: str) -> str:
    """The version a module says, for one on the path but not installed (a checkout)."""
    module = sys.modules.get(name)
    if module is None:
        try:
            module = __import__(name)
        except ImportError:
            return "none"
    return str(getattr(module, "__version__", "unknown"))


def mismatch(
    ours: dict[str, str], theirs: dict[str, str], where: str, *, ray: bool = True
) -> str | None:
    """One line naming the node and every version that differs, or None (``ray``: Ray's
    version counts, and Ray can install the others)."""
    differ = [
        f"{name} {theirs.get(name, 'none')} there, {ours.get(name, 'none')} here"
        for name in VERSIONED
        if theirs.get(name) != ours.get(name) and (ray or name != "ray")
    ]
    if not differ:
        return None
    how = " (or pass runtime_env with nbddp.RayCluster)" if ray else ""
    return (
        f"node {where} has different versions than this notebook ({'; '.join(differ)}); "
        f"install the same versions there{how}"
    )
