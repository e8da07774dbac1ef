"""``nbddp.log`` outside a launch, and the ``Metrics`` history."""

from __future__ import annotations

import sys

import pytest

import nbddp
from nbddp.rank.metrics import Metrics


def test_log_outside_a_launch_is_a_no_op() -> None:
    assert nbddp.log(step=1, loss=0.5) is None
    nbddp.log(loss=object())  # not even checked: unlaunched code pays nothing


def test_to_pandas_orders_columns() -> None:
    pytest.importorskip("pandas")
    rows = Metrics(
        [
            {"rank": 0, "step": 0, "time": 1.0, "loss": 2.0},
            {"rank": 1, "step": 0, "time": 1.5, "loss": 2.5, "acc": 0.1},
        ]
    )
    frame = rows.to_pandas()
    assert list(frame.columns) == ["rank", "step", "time", "loss", "acc"]
    assert frame["loss"].tolist() == [2.0, 2.5]


def test_to_pandas_empty() -> None:
    pytest.importorskip("pandas")
    assert list(Metrics().to_pandas().columns) == ["rank", "step", "time"]


def test_to_pandas_without_pandas_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pandas", None)  # import pandas now fails
    with pytest.raises(ImportError, match="pip install pandas"):
        Metrics().to_pandas()


def test_metrics_is_a_list() -> None:
    rows = Metrics([{"rank": 0}])
    assert rows == [{"rank": 0}]
    assert isinstance(rows, list)
