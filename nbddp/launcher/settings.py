"""The ``NBDDP_*`` environment variables a user may set, read in one place, one way.

``read(environ)`` returns every setting as a typed ``Settings`` (defaults when unset or empty), or
raises ``ConfigError`` naming the first bad variable, what it must be and its default. Every launch
reads them afresh; importing nbddp never raises for them (``prewarm_wanted``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from nbddp.errors import ConfigError

T = TypeVar("T")


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One variable: its name, default, what a value must be, and how it is read."""

    name: str
    default: T
    must_be: str
    parse: Callable[[str], T]
    """The value of the stripped, non-empty text; raises ``ValueError`` when wrong."""

    def get(self, environ: Mapping[str, str]) -> T:
        text = environ.get(self.name, "").strip()
        if not text:
            return self.default
        try:
            return self.parse(text)
        except ValueError:
            raise ConfigError(
                f"{self.name}={environ[self.name]!r} is not {self.must_be}; set "
                f"{self.name}={self.default} (the default) or another such value, or unset it"
            ) from None


def _number(low: float, *, whole: bool = False, above: bool = False) -> Callable[[str], float]:
    def parse(text: str) -> float:
        value = float(text)
        if not math.isfinite(value) or value < low or (above and value == low):
            raise ValueError(text)
        if whole and value != int(value):
            raise ValueError(text)
        return value

    return parse


def _switch(text: str) -> bool:
    word = text.lower()
    if word not in ("0", "1", "false", "true", "no", "yes", "off", "on"):
        raise ValueError(text)
    return word in ("1", "true", "yes", "on")


PREWARM = Setting("NBDDP_PREWARM", True, "0 or 1", _switch)
"""Start the forkserver when nbddp is imported."""
POOL = Setting[float]("NBDDP_POOL", 8, "a whole number of workers >= 0", _number(0, whole=True))
"""The most idle workers the forkserver keeps after a launch (0: none)."""
POOL_IDLE = Setting("NBDDP_POOL_IDLE", 300.0, "a number of seconds >= 0", _number(0))
"""Seconds without a launch before the idle workers end."""
LOG_DIR = Setting[str | None]("NBDDP_LOG_DIR", None, "a directory", lambda text: text)
"""Where run directories go; unset: ``$TMPDIR/nbddp-<uid>``."""
LOG_KEEP = Setting[float](
    "NBDDP_LOG_KEEP", 50, "a whole number of runs >= 1", _number(1, whole=True)
)
"""The most run directories kept, the new one included."""
LOG_MAX_MB = Setting[float](
    "NBDDP_LOG_MAX_MB", 500, "a number of megabytes > 0", _number(0, above=True)
)
"""The most megabytes all run directories hold together."""
CLUSTER = Setting[str | None]("NBDDP_CLUSTER", None, "slurm or a Ray address", lambda text: text)
"""The cluster ``notebook_launcher(num_nodes=...)`` runs on (checked as ``cluster`` is)."""
SLURM_ADDRESS = Setting[str | None](
    "NBDDP_SLURM_ADDRESS", None, "an address of this host", lambda text: text
)
"""Where a Slurm job's agents reach the notebook (default: this host's address towards
the job's first node)."""
CLUSTER_IDLE = Setting("NBDDP_CLUSTER_IDLE", 300.0, "a number of seconds >= 0", _number(0))
"""Seconds after its last run before a cluster's kept agents are handed back (at once when another
driver waits): launches stay warm while a notebook is edited, and one left open lets go."""


@dataclass(frozen=True)
class Settings:
    """Every setting's value."""

    prewarm: bool
    pool: int
    pool_idle: float
    log_dir: Path | None
    log_keep: int
    log_max_bytes: int
    cluster: str | None
    cluster_idle: float
    slurm_address: str | None


def read(environ: Mapping[str, str] | None = None) -> Settings:
    """Every setting of ``environ`` (default ``os.environ``); ``ConfigError`` for the first."""
    env = os.environ if environ is None else environ
    log_dir = LOG_DIR.get(env)
    return Settings(
        prewarm=PREWARM.get(env),
        pool=int(POOL.get(env)),
        pool_idle=POOL_IDLE.get(env),
        log_dir=Path(log_dir).expanduser().absolute() if log_dir else None,
        log_keep=int(LOG_KEEP.get(env)),
        log_max_bytes=int(LOG_MAX_MB.get(env) * (1 << 20)),
        cluster=CLUSTER.get(env),
        cluster_idle=CLUSTER_IDLE.get(env),
        slurm_address=SLURM_ADDRESS.get(env),
    )


def prewarm_wanted(environ: Mapping[str, str] | None = None) -> bool:
    """Whether to warm up at import: ``NBDDP_PREWARM``, and no bad value."""
    try:
        return PREWARM.get(os.environ if environ is None else environ)
    except ConfigError:
        return False
