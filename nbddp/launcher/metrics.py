"""``Metrics``: the notebook's history of the rows ranks send with ``nbddp.log``.

Contract: a ``Metrics`` is a plain list of rows (dicts with ``rank``,
``step``, ``time`` and the logged values) in arrival order, as
``Run.metrics`` and ``RunResult.metrics`` hold them; ``to_pandas()`` makes
a DataFrame when pandas is installed (it is optional). The rank's side,
``nbddp.log``, is ``nbddp.rank.metrics``.
"""

from __future__ import annotations

import importlib
from typing import Any


class Metrics(list[dict[str, Any]]):
    """Metric rows (dicts with ``rank``, ``step``, ``time`` and the values), in arrival order."""

    def to_pandas(self) -> Any:
        """A ``pandas.DataFrame``, one row per logged row; columns rank, step, time, values.

        Raises ``ImportError`` saying what to install when pandas is missing.
        """
        try:
            pd = importlib.import_module("pandas")  # optional: imported only when asked
        except ImportError as exc:
            raise ImportError(
                "Metrics.to_pandas() needs pandas: pip install pandas "
                "(the rows are also a plain list of dicts)"
            ) from exc
        names: dict[str, None] = dict.fromkeys(("rank", "step", "time"))
        for row in self:
            names.update(dict.fromkeys(row))
        return pd.DataFrame(list(self), columns=list(names))
