"""What a finished run produced: ``RunResult``, its ``Metrics``, and ``UnloadedValue``.

``load_values(outcomes, log_dir)`` rebuilds each rank's return value once. Only rank 0's can fail
a run (``ResultError``); another rank's that cannot be rebuilt is an ``UnloadedValue`` saying why.
``Metrics`` are the ``nbddp.log`` rows in arrival order.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nbddp.errors import ResultError
from nbddp.launcher.events import RankOutcome
from nbddp.launcher.logs import rank_log
from nbddp.wire.payload import short_error
from nbddp.wire.protocol import MetricRow
from nbddp.wire.values import unpack


class Metrics(list[MetricRow]):
    """Metric rows (dicts with ``rank``, ``step``, ``time`` and the values), in arrival order."""

    def to_pandas(self) -> Any:
        """A ``pandas.DataFrame``, one row per logged row (columns rank, step, time, values);
        ``ImportError`` saying what to install when pandas is missing."""
        try:
            pd = importlib.import_module("pandas")  # optional: imported only when asked
        except ImportError as exc:
            raise ImportError(
                "Metrics.to_pandas() needs pandas: pip install 'nbddp[notebook]' (or pandas) "
                "(the rows are also a plain list of dicts)"
            ) from exc
        names: dict[str, None] = dict.fromkeys(("rank", "step", "time"))
        for row in self:
            names.update(dict.fromkeys(row))
        return pd.DataFrame(list(self), columns=list(names))


@dataclass
class RunResult:
    """Everything a finished run produced, keyed by rank."""

    values: dict[int, Any]
    """Each rank's return value (CUDA tensors moved to CPU)."""
    exit_codes: dict[int, int | None]
    """Each rank's exit code; negative: killed by that signal; None: unknown."""
    log_dir: Path
    """The run's directory: ``rank{N}.log`` holds everything rank N wrote."""
    metrics: Metrics = field(default_factory=Metrics)
    """Rows sent with ``nbddp.log``, in arrival order (``metrics.to_pandas()``)."""
    failure: BaseException | None = None
    """The root-cause error, if the run failed."""
    duration: float = 0.0
    """Seconds from start until the last rank's output was complete."""

    def log_path(self, rank: int) -> Path:
        """The full log of ``rank``."""
        return rank_log(self.log_dir, rank)


@dataclass(frozen=True)
class UnloadedValue:
    """Stands in ``RunResult.values`` for a rank's value that cannot be rebuilt here."""

    rank: int
    type_name: str
    """The value's type in the rank."""
    reason: str
    """What rebuilding it raised."""

    def __repr__(self) -> str:
        return (
            f"<rank {self.rank}'s return value ({self.type_name}) "
            f"could not be rebuilt in the notebook: {self.reason}>"
        )


def load_values(
    outcomes: Sequence[RankOutcome], log_dir: Path
) -> tuple[dict[int, Any], ResultError | None]:
    """Each rank's value, and the error for rank 0's when it cannot be rebuilt."""
    values: dict[int, Any] = {}
    error: ResultError | None = None
    for outcome in outcomes:
        packed = outcome.value
        if packed is None:
            continue
        try:
            values[outcome.rank] = unpack(packed)
        except Exception as exc:
            values[outcome.rank] = UnloadedValue(outcome.rank, packed.type_name, short_error(exc))
            if outcome.rank == 0:
                error = ResultError(
                    f"rank 0's return value ({packed.type_name}) cannot be rebuilt in the "
                    f"notebook: {short_error(exc)}. Return plain data (numbers, strings, "
                    "tensors, arrays, and lists or dicts of them), or make sure its class "
                    "can be imported in the notebook too",
                    rank=0,
                    type_name=packed.type_name,
                    log_path=str(rank_log(log_dir, 0)),
                )
                error.__cause__ = exc
    return values, error
