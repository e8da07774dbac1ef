"""The ``cluster`` launch option's value: which cluster a run goes to.

``RayCluster(address, runtime_env=None)`` names a Ray cluster as ``ray.init`` does;
``SlurmCluster()`` (``"slurm"``) the Slurm allocation this process runs in. ``as_cluster(value)``
turns an option's value into one or says in one line what is wrong; ``configured()`` is the cluster
``NBDDP_CLUSTER`` names. Nothing here imports ray or calls Slurm.
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field

from nbddp.errors import ConfigError
from nbddp.launcher import settings


@dataclass(frozen=True)
class RayCluster:
    """A Ray cluster to run on, for ``launch(..., cluster=RayCluster(...))``."""

    address: str
    """As ``ray.init`` takes it: ``"ray://head:10001"`` (Ray Client), ``"ray"`` or ``"auto"``
    (the cluster this process runs in), or a GCS ``"host:6379"``."""
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
    """A Slurm allocation to run on, for ``launch(..., cluster=SlurmCluster(...))``.

    With no arguments (``"slurm"``): the allocation this process runs in (``salloc``, ``sbatch``).
    With any: nbddp asks Slurm for one of its own (from a login node), as ``salloc`` would with
    ``--partition``, ``--time``, ``--account``, ``--qos``, ``--gpus-per-node`` and ``extra_args``,
    and gives it back with its agents; ``keep=True`` keeps it past this process, under ``name``, for
    a later process asking for the same name to use again. As a string:
    ``"slurm --partition gpu --time 1:00:00 --keep exp1"``.
    """

    partition: str | None = None
    time: str | None = None
    """Slurm's time limit: ``"30"`` (minutes), ``"1:00:00"``, ``"1-0"``."""
    account: str | None = None
    qos: str | None = None
    gpus_per_node: int | None = None
    """None: the GPUs a run asks for on each node (``gpus=``)."""
    extra_args: tuple[str, ...] = ()
    """Any other ``salloc`` flags, as given on its command line."""
    keep: bool = False
    name: str | None = None
    """The allocation's name with ``keep``: a later ``SlurmCluster(keep=True, name=...)``
    uses the allocation of that name while it lasts."""

    @property
    def submits(self) -> bool:
        """Whether nbddp asks Slurm for an allocation (not the one this runs in)."""
        return self != SlurmCluster()

    def __post_init__(self) -> None:
        object.__setattr__(self, "extra_args", tuple(self.extra_args))  # a list given too
        if self.keep and not self.name:
            raise ConfigError(
                "SlurmCluster(keep=True) needs a name=..., by which a later kernel finds the "
                "allocation again"
            )

    def __str__(self) -> str:
        return " ".join(["slurm", *self.salloc_args(), *([f"--keep={self.name}"] * self.keep)])

    address = property(__str__)

    def salloc_args(self) -> list[str]:
        """The allocation's ``salloc`` flags, nodes aside."""
        named = [self.partition, self.time, self.account, self.qos, self.gpus_per_node]
        flags = ("partition", "time", "account", "qos", "gpus-per-node")
        return [*(f"--{k}={v}" for k, v in zip(flags, named, strict=True) if v), *self.extra_args]


def _slurm(text: str) -> SlurmCluster:
    """``"slurm --partition gpu --keep exp1 --exclusive"`` as a ``SlurmCluster``."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    for name in ("partition", "time", "account", "qos", "keep"):
        parser.add_argument(f"--{name}")
    parser.add_argument("--gpus-per-node", type=int)
    try:
        known, extra = parser.parse_known_args(shlex.split(text)[1:])
    except argparse.ArgumentError as exc:
        raise ValueError(f"has {exc}") from None
    name = vars(known).pop("keep")
    return SlurmCluster(**vars(known), extra_args=tuple(extra), keep=bool(name), name=name)


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
    if len(address) > 1 and address[0] == address[-1] and address[0] in "'\"":  # quoted
        address = address[1:-1].strip()
    if address.split()[:1] == ["slurm"]:
        return _slurm(address)
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
