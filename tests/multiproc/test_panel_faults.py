"""Whatever breaks while the panel shows a run, the panel ends in a true state and its
Stop and ``close()`` still end every rank (driven through its widgets, no browser)."""

from __future__ import annotations

from typing import Any

import psutil
import pytest

import nbddp
from nbddp.display.model import RunModel
from nbddp.launcher.run import Run
from nbddp.notebook.panel.panel import Panel
from tests.multiproc.fns import all_reduce_sum
from tests.multiproc.test_panel import shown_state, steps, until
from tests.procs import threads_and_fds as _resources
from tests.procs import wait_procs_gone


class BadRepr:
    def __repr__(self) -> str:
        raise RuntimeError("no repr for you")


def returns_bad_repr() -> BadRepr:
    return BadRepr()


def _same_resources(before: tuple[int, int]) -> bool:
    # As in test_reliability: the rendezvous store's socket closes on torch's own
    # thread, so one fd (and that thread) may still be there.
    now = _resources()
    return abs(now[0] - before[0]) <= 1 and abs(now[1] - before[1]) <= 1


def _gone(pids: list[int]) -> bool:
    procs = [psutil.Process(p) for p in pids if psutil.pid_exists(p)]
    return not wait_procs_gone(procs, 10)


def test_a_value_whose_repr_raises_still_ends_as_done() -> None:
    panel = Panel(returns_bad_repr)
    panel.view.launch_button.click()
    assert panel.run is not None
    panel.wait(60)
    assert shown_state(panel) == "done"
    assert "&lt;BadRepr object; its repr raised RuntimeError&gt;" in panel.view.result.value
    assert panel.view.stop_button.disabled and not panel.view.launch_button.disabled


def test_a_display_error_is_reported_and_the_run_stays_stoppable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(self: RunModel, rank: int, stream: str, text: str) -> None:
        raise MemoryError

    nbddp.launch(all_reduce_sum, 0.0, procs=2, output="none")  # warm: loop thread, forkserver
    before = _resources()
    monkeypatch.setattr(RunModel, "output", broken)
    panel = Panel(steps, (1_000_000, 0.01))
    run = panel.launch()
    until(lambda: len(run.metrics) >= 3)  # the run went on after the display failed
    assert shown_state(panel) == "running"
    assert not panel.view.stop_button.disabled and panel.view.launch_button.disabled
    pids = list(run.pids.values())
    panel.view.stop_button.click()
    with pytest.raises(nbddp.RankError, match="stopped"):
        panel.wait(60)
    assert shown_state(panel) == "stopped"
    assert _gone(pids)
    err = capsys.readouterr().err
    assert err.count("the display failed (MemoryError)") == 1, err
    panel.close()
    until(lambda: _same_resources(before), 10)


def test_when_wait_itself_breaks_stop_and_close_still_end_every_rank(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken_wait(self: Run, timeout: float | None = None) -> Any:
        raise RuntimeError("wait broke")

    monkeypatch.setattr(Run, "wait", broken_wait)
    panel = Panel(steps, (1_000_000, 0.01))
    run = panel.launch()
    until(lambda: shown_state(panel) == "error")
    assert "wait broke" in panel.view.result.value
    # The run goes on with nothing pumping it: the panel says it can still be stopped.
    assert panel.running and not run.ended()
    assert not panel.view.stop_button.disabled and panel.view.launch_button.disabled
    pids = list(run.pids.values())
    panel.close()
    assert run.ended() and _gone(pids)
