"""``nbddp.log`` from launched ranks: rows arrive with rank, step and time; text display."""

from __future__ import annotations

import time

import pytest

import nbddp


def train(steps: int) -> int:
    for step in range(steps):
        nbddp.log(step=step, loss=1.0 / (step + 1), lr=0.1)
    nbddp.log(epoch_loss=0.5)  # no step
    return steps


def bad_value() -> None:
    nbddp.log(step=0, loss="high")


def reserved_name() -> None:
    nbddp.log(step=0, time=3.0)


def test_rows_arrive_with_rank_step_time(capsys: pytest.CaptureFixture[str]) -> None:
    before = time.time()
    run = nbddp.launch(train, 20, procs=2, block=False)
    result = run.wait()
    assert result.values == {0: 20, 1: 20}
    assert len(result.metrics) == len(run.metrics) == 42
    for rank in (0, 1):
        rows = [r for r in result.metrics if r["rank"] == rank]
        assert [r["step"] for r in rows] == [*range(20), None]
        assert rows[3]["loss"] == pytest.approx(0.25)
        assert rows[-1] == {"rank": rank, "step": None, "time": rows[-1]["time"], "epoch_loss": 0.5}
        assert all(before <= r["time"] <= time.time() for r in rows)
    out = capsys.readouterr().out
    # Outside a kernel, metric lines are printed (rate-limited), the last one always.
    assert "[rank 0] step 0 loss=1 lr=0.1" in out
    assert "[rank 1] epoch_loss=0.5" in out


def test_to_pandas_on_a_real_run() -> None:
    pytest.importorskip("pandas")
    result = nbddp.launch(train, 5, procs=2, block=False).wait()
    frame = result.metrics.to_pandas()
    assert list(frame.columns) == ["rank", "step", "time", "loss", "lr", "epoch_loss"]
    assert len(frame) == 12
    assert sorted(frame["rank"].unique()) == [0, 1]


def test_a_value_that_is_not_a_number_raises_in_the_rank() -> None:
    with pytest.raises(TypeError, match="loss='high' is not a number"):
        nbddp.launch(bad_value, procs=2)


def test_reserved_names_are_refused() -> None:
    with pytest.raises(ValueError, match="time is set by nbddp"):
        nbddp.launch(reserved_name, procs=2)
