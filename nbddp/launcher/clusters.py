"""The ``cluster`` launch option's value: which cluster a run goes to.

``RayCluster(address, runtime_env=None)`` names a Ray cluster as ``ray.init``
does; ``SlurmCluster()`` (``"slurm"``) the Slurm allocation this process runs
in. ``as_cluster(value)`` turns an option's value into one or says in one line
what is wrong; ``configured()`` is the cluster ``NBDDP_CLUSTER`` names. Nothing
here imports ray or calls Slurm.
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


@dataclass(frozen=True)
class SlurmCluster:
    """The Slurm allocation this process runs in (``salloc``, ``sbatch``), for
    ``launch(..., cluster="slurm")``: one agent per node runs as a step of it."""

    @property
    def address(self) -> str:
        return "slurm"

    def __str__(self) -> str:
        return self.address


Cluster = RayCluster | SlurmCluster


def as_cluster(value: object) -> Cluster | None:
    """The cluster an option's value names, or None; else ``ValueError`` saying what is wrong."""
    if value is None or isinstance(value, RayCluster | SlurmCluster):
        return value
    if not isinstance(value, str) or not value.strip():
        raise ValueError(
            "must be 'slurm' (the Slurm allocation this runs in), a Ray address such as "
            f"'ray://head:10001', 'ray' (the Ray cluster this runs in) or nbddp.RayCluster(...), "
            f"got {value!r}"
        )
    address = value.strip()
    if address == "slurm":
        return SlurmCluster()
    if address not in ("ray", "auto") and ":" not in address:
        raise ValueError(
            f"{address!r} is not a Ray address; use 'ray://{address}:10001' (Ray Client), "
            f"'{address}:6379' (its GCS) or 'ray' (the cluster this runs in)"
        )
    return RayCluster(address)


def configured() -> Cluster | None:
    """The cluster ``NBDDP_CLUSTER`` names, if set; ``ConfigError`` if it names none."""
    try:
        return as_cluster(settings.read().cluster)
    except ValueError as exc:
        raise ConfigError(f"{settings.CLUSTER.name} {exc}") from None
