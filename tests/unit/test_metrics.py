"""``nbddp.log`` outside a launch, and the ``Metrics`` history."""

from __future__ import annotations

import socket
import sys

import pytest
import torch

import nbddp
from nbddp.launcher.results import Metrics
from nbddp.rank import channel as rank_channel
from nbddp.rank import context
from nbddp.rank.channel import Channel
from nbddp.wire.protocol import FrameReader, Placement


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
    with pytest.raises(ImportError, match=r"pip install 'nbddp\[notebook\]'"):
        Metrics().to_pandas()


def test_metrics_is_a_list() -> None:
    rows = Metrics([{"rank": 0}])
    assert rows == [{"rank": 0}]
    assert isinstance(rows, list)


def test_log_sends_through_the_installed_channel_with_the_contexts_rank(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RANK", "7")  # the user's environment: the rank comes from the order
    ours, theirs = socket.socketpair()
    theirs.settimeout(5.0)
    rank_channel.install(Channel(ours))
    context.install(Placement(rank=3, local_rank=1, world_size=4, device="cpu"))
    try:
        nbddp.log(step=2, loss=torch.tensor(0.25), acc=1)
        reader, got = FrameReader(), []
        while not got:
            got = reader.feed(theirs.recv(1 << 16))
    finally:
        rank_channel.install(None)
        context.install(None)
        ours.close()
        theirs.close()
    [(kind, [row])] = got
    assert kind == "metrics"
    assert isinstance(row.pop("time"), float)
    assert row == {"rank": 3, "step": 2, "loss": 0.25, "acc": 1}
    nbddp.log(step=3, loss=1.0)  # removed again: a no-op


def test_log_checks_values_inside_a_rank() -> None:
    ours, theirs = socket.socketpair()
    rank_channel.install(Channel(ours))
    try:
        with pytest.raises(TypeError, match="loss='high' is not a number"):
            nbddp.log(loss="high")
        with pytest.raises(ValueError, match="rank is set by nbddp"):
            nbddp.log(rank=1.0)
    finally:
        rank_channel.install(None)
        ours.close()
        theirs.close()
