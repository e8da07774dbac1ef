"""``nbddp.log``: a metric row from a rank to the notebook.

Contract: inside a launched rank, ``log(step=..., **values)`` sends one row
``{"rank", "step", "time", **values}`` (``time``: wall-clock seconds since
the epoch) to the notebook, where ``Run.metrics`` and
``RunResult.metrics`` (``launcher.metrics.Metrics``) keep every row in arrival order and the display
shows the latest and a chart. Values must be numbers (or 0-d tensors,
converted with ``.item()``); anything else, or a value named ``rank``,
``step`` or ``time``, raises in the caller, where the mistake is.

Rows logged in quick succession are sent in batches (every 20 ms while
they keep coming, the last ones within 0.1 s; ``channel.Channel.send_row``),
always before the rank's result.

In a process the rank forks (DataLoader workers, ``os.fork``), rows reach
the notebook through the rank (``channel``). A process a rank starts
another way (a spawn or forkserver DataLoader context, a subprocess) has no
way to the notebook: there ``log`` raises ``RuntimeError`` saying so, rather
than dropping the rows.

Outside a launch, ``log`` returns at once and checks nothing: the same
training code runs unlaunched at no cost (no ``.item()``, so no CUDA
synchronisation).
"""

from __future__ import annotations

import os
import time
from numbers import Real
from typing import Any

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


def log(step: int | None = None, **values: Any) -> None:
    """Send a metric row to the notebook: ``nbddp.log(step=step, loss=loss.item())``.

    The row (``rank``, ``step``, ``time`` and the values) is kept in
    ``Run.metrics`` and ``RunResult.metrics`` and drawn as a live chart.
    Values must be numbers or 0-d tensors; a value named ``rank``, ``step``
    or ``time`` raises. Outside a launch it returns at once and checks
    nothing, so the same code runs unlaunched (see module contract).
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
    row.update(values)
    channel.send_row(row)
