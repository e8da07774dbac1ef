"""``nbddp.log``: a metric row from a rank to the notebook.

In a launched rank, ``log(step=..., **values)`` sends ``{"rank", "step", "time", **values}``,
batched (``Channel.send_row``) and always before the rank's result; a value it refuses raises
in the caller (see ``log``). Processes the rank forks log through it; one started another way
raises ``RuntimeError``.
"""

from __future__ import annotations

import os
import time
from numbers import Real
from typing import cast

from nbddp.rank import channel as rank_channel
from nbddp.rank import context
from nbddp.rank.channel import Row

RESERVED = frozenset(("rank", "step", "time"))
# Read once, at import: a process a rank started by exec (spawn) imports nbddp
# afresh with the rank's environment; the rank itself and its forks have a channel.
_STARTED_BY_A_RANK = os.environ.get("NBDDP_ROLE") == "worker"


def _number(name: str, value: object) -> float | int:
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "ndim", 0) == 0:
        value = item()
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"nbddp.log: {name}={value!r} is not a number")
    return value if isinstance(value, int) else float(value)


def log(step: int | None = None, **values: object) -> None:
    """Send a metric row to the notebook: ``nbddp.log(step=step, loss=loss.item())``.

    Kept in ``Run.metrics`` and ``RunResult.metrics`` and drawn as a live chart. Values must
    be numbers or 0-d tensors; ``rank``, ``step`` and ``time`` are nbddp's. Outside a launch
    it returns at once and checks nothing, so the same code runs unlaunched.
    """
    channel = rank_channel.installed()
    if channel is None:
        if _STARTED_BY_A_RANK:
            raise RuntimeError(
                "nbddp.log works in a rank and in the processes it forks; this process was "
                "started another way (spawn, forkserver, a subprocess), so its rows cannot "
                "reach the notebook: use the fork context for DataLoader workers, or log "
                "from the rank"
            )
        return
    # This runs every training step: plain numbers, the common case, are
    # checked inline without a call per value.
    for name, value in values.items():
        kind = type(value)
        if kind is not float and kind is not int:
            values[name] = _number(name, value)
    if not RESERVED.isdisjoint(values):
        clash = ", ".join(sorted(RESERVED.intersection(values)))
        raise ValueError(f"nbddp.log: {clash} is set by nbddp; rename it")
    place = context.current()
    row: Row = {
        "rank": place.rank if place is not None else 0,
        "step": None if step is None else int(step),
        "time": time.time(),
    }
    row.update(cast(Row, values))  # every value is a number now
    channel.send_row(row)
