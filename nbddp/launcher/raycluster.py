"""The ``cluster`` launch option's value: which Ray cluster a run goes to.

``RayCluster(address, runtime_env=None)`` names a cluster as ``ray.init`` does.
``as_cluster(value)`` turns an option's value into one or says in one line
what is wrong; ``configured()`` is the cluster ``NBDDP_CLUSTER`` names. Nothing
here imports ray.
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
    ``"host:6379"``; ``runtime_env`` is Ray's, for the agents and so the ranks.
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
    """The cluster an option's value names, or None; else ``ValueError`` saying what is wrong."""
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
