"""``nbddp.log``: a metric row from a rank to the notebook.

Contract: inside a launched rank, ``log(step=..., **values)`` sends one row
``{"rank", "step", "time", **values}`` to the notebook, where it is kept in
``RunResult.metrics`` in arrival order. Outside a launch it does nothing,
so the same training code runs unlaunched. Values must be numbers (or
0-d tensors, converted with ``.item()``); anything else raises TypeError
in the caller, where the mistake is.
"""

from __future__ import annotations

import os
import time
from numbers import Real
from typing import Any

from . import worker


def _number(name: str, value: Any) -> float | int:
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "ndim", 0) == 0:
        value = item()
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"nbddp.log: {name}={value!r} is not a number")
    return value if isinstance(value, int) else float(value)


def log(step: int | None = None, **values: Any) -> None:
    """Send a metric row to the notebook (see module contract)."""
    channel = worker.CHANNEL
    row: dict[str, Any] = {k: _number(k, v) for k, v in values.items()}
    if channel is None:
        return
    row["rank"] = int(os.environ.get("RANK", "0"))
    row["step"] = None if step is None else int(step)
    row["time"] = time.time()
    channel.send("metric", row)
