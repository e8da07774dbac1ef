"""The ``cluster`` launch option's value: which Ray cluster a run goes to.

Contract: ``RayCluster(address, runtime_env=None)`` names a cluster the way
``ray.init`` does: ``"ray://head:10001"`` (Ray Client, from a notebook
outside the cluster), ``"ray"`` or ``"auto"`` (the cluster this process runs
inside), or a GCS address ``"host:6379"``. ``as_cluster(value)`` turns an
option's value (a string or a ``RayCluster``) into one, and says in one line
what is wrong otherwise. ``configured()`` is the cluster named by
``NBDDP_CLUSTER`` (what ``notebook_launcher(num_nodes=...)`` uses).

Nothing here imports ray: the option is checked before any process starts,
also where ray is not installed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from nbddp.errors import ConfigError
from nbddp.launcher import settings


@dataclass(frozen=True)
class RayCluster:
    """A Ray cluster to run on, for ``launch(..., cluster=RayCluster(...))``.

    ``address`` as ``ray.init`` takes it: ``"ray://head:10001"`` (Ray Client),
    ``"ray"`` or ``"auto"`` (the cluster this process runs in), or a GCS
    ``"host:6379"``; ``runtime_env`` is Ray's, for the agents and so the ranks
    (see module contract).
    """

    address: str
    """``ray://head:10001``, ``ray`` (this process's cluster) or a GCS ``host:port``."""
    runtime_env: Mapping[str, object] | None = field(default=None, compare=False)
    """Ray's ``runtime_env`` for the agents (and so the ranks): ``pip``, ``env_vars``..."""

    def __str__(self) -> str:
        return self.address

    @property
    def ray_address(self) -> str:
        """The address as ``ray.init`` takes it."""
        return "auto" if self.address == "ray" else self.address


def as_cluster(value: object) -> RayCluster | None:
    """The cluster an option's value names, or None; ``ValueError`` with what is wrong,
    to follow the option's name, otherwise (see module contract)."""
    if value is None or isinstance(value, RayCluster):
        return value
    if not isinstance(value, str) or not value.strip():
        raise ValueError(
            "must be a Ray address such as 'ray://head:10001', 'ray' (the cluster this runs "
            f"in) or nbddp.RayCluster(...), got {value!r}"
        )
    address = value.strip()
    if address not in ("ray", "auto") and ":" not in address:
        raise ValueError(
            f"{address!r} is not a Ray address; use 'ray://{address}:10001' (Ray Client), "
            f"'{address}:6379' (its GCS) or 'ray' (the cluster this runs in)"
        )
    return RayCluster(address)


def configured() -> RayCluster | None:
    """The cluster ``NBDDP_CLUSTER`` names, if set; ``ConfigError`` if it names none."""
    try:
        return as_cluster(settings.read().cluster)
    except ValueError as exc:
        raise ConfigError(f"{settings.CLUSTER.name} {exc}") from None
