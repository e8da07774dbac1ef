"""The panel driven through its widgets (no browser): launch, stop, fail, relaunch, close.

Buttons are clicked with ``Button.click()``, which runs the same handlers a
browser click does; what the panel shows is read back from its widgets.
The browser itself is covered by ``tests/browser``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

import nbddp
from nbddp.notebook.panel import cells
from nbddp.notebook.panel.panel import Panel
from tests.multiproc.fns import fail_on
from tests.procs import wait_procs_gone


def steps(n: int, delay: float) -> int:
    import os

    for i in range(n):
        print(f"step {i}", flush=True)
        nbddp.log(step=i, loss=1.0 / (i + 1))
        if delay:
            threading.Event().wait(delay)
    return int(os.environ["RANK"]) + 100


def until(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    """Wait for ``condition`` (checked every 20 ms) or fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    tick = threading.Event()
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        tick.wait(0.02)


def shown_state(panel: Panel) -> str:
    value = panel.view.run_state.value
    return value.split('data-state="', 1)[1].split('"', 1)[0]


def test_launch_button_runs_to_done_and_shows_everything() -> None:
    panel = Panel(steps, (5, 0.0))
    assert not panel.view.launch_button.disabled and panel.view.stop_button.disabled
    panel.view.procs.value = "2"
    panel.view.launch_button.click()
    assert panel.run is not None
    result = panel.wait(60)
    assert result.values == {0: 100, 1: 101}
    assert shown_state(panel) == "done"
    table = panel.view.ranks.value
    assert table.count('data-state="done"') == 4  # the row and its state span, per rank
    assert panel.view.tabs.titles == ("rank 0 · done", "rank 1 · done")
    assert "step 4" in panel.view.tabs.children[1].value
    assert "<svg" in panel.view.chart.value and "loss" in panel.view.chart.value
    assert 'rank 0 returned <code class="nbddp-value">100</code>' in panel.view.result.value
    assert not panel.view.launch_button.disabled and panel.view.stop_button.disabled
    # Launching again from the same panel starts a fresh run.
    first = panel.run
    panel.view.launch_button.click()
    assert panel.wait(60).values == {0: 100, 1: 101}
    assert panel.run is not first


def test_stop_button_ends_every_rank_and_shows_stopped() -> None:
    panel = Panel(steps, (1_000_000, 0.01))
    panel.view.launch_button.click()
    run = panel.run
    assert run is not None
    until(lambda: len(run.metrics) >= 2)
    assert not panel.view.stop_button.disabled and panel.view.launch_button.disabled
    pids = list(run.pids.values())
    panel.view.stop_button.click()
    with pytest.raises(nbddp.RankError, match="stopped"):
        panel.wait(60)
    assert shown_state(panel) == "stopped"
    assert run.rank_states() == {0: "stopped", 1: "stopped"}
    import psutil

    assert not wait_procs_gone([psutil.Process(p) for p in pids if psutil.pid_exists(p)], 10)
    assert not panel.view.launch_button.disabled


def test_a_failing_rank_shows_its_error_and_traceback() -> None:
    panel = Panel(fail_on, (1, "raise"))
    panel.view.launch_button.click()
    with pytest.raises(Exception, match="boom on rank 1"):
        panel.wait(60)
    assert shown_state(panel) == "failed"
    shown = panel.view.result.value
    assert "CustomError: boom on rank 1" in shown
    assert "raise CustomError" in shown  # the rank's own traceback
    assert "rank 1 about to raise" in panel.view.tabs.children[1].value


def test_invalid_settings_disable_launch_and_say_why() -> None:
    panel = Panel(steps, (1, 0.0))
    panel.view.timeout.value = "soon"
    assert panel.view.launch_button.disabled
    assert "seconds" in panel.view.errors["timeout"].value
    assert "Fix the settings" in panel.view.code.value
    with pytest.raises(nbddp.ConfigError, match="timeout"):
        panel.launch()
    panel.view.launch_button.click()  # a click that slips through is refused in the panel
    assert panel.run is None
    assert "ConfigError" in panel.view.result.value
    panel.view.timeout.value = ""
    assert not panel.view.launch_button.disabled
    assert "nbddp.launch(steps, 1, 0.0, procs=2)" in panel.view.code.value


def test_an_unsendable_argument_is_shown_not_launched() -> None:
    panel = Panel(steps, (threading.Lock(), 0.0))
    panel.view.launch_button.click()
    assert panel.run is None
    assert "PayloadError" in panel.view.result.value
    assert 'data-state="error"' in panel.view.run_state.value
    # The code says what it could not write, and names it after its parameter.
    assert "# define n first: nbddp.panel was given a lock" in panel.view.code.value
    assert "nbddp.launch(steps, n, 0.0, procs=2)" in panel.view.code.value


def test_close_stops_the_run_and_the_panel_cannot_launch_again() -> None:
    panel = Panel(steps, (1_000_000, 0.01))
    run = panel.launch()
    until(lambda: len(run.metrics) >= 1)
    panel.close()
    assert run.status == "stopped" and not panel.running
    with pytest.raises(RuntimeError, match="closed"):
        panel.launch()


def test_panels_of_a_cell_close_when_it_runs_again() -> None:
    # What the kernel hook does when a panel's cell runs again or is deleted.
    panel = Panel(steps, (1_000_000, 0.01))
    run = panel.launch()
    cells._BY_CELL.setdefault("cell-a", []).append(panel)
    until(lambda: len(run.metrics) >= 1)
    cells.close_for_cells(["cell-b"])
    assert panel.running
    cells.close_for_cells(["cell-a"])
    with pytest.raises(nbddp.RankError, match="stopped"):
        panel.wait(60)
    assert "cell-a" not in cells._BY_CELL


def test_a_second_launch_while_running_is_refused() -> None:
    panel = Panel(steps, (1_000_000, 0.01))
    panel.launch()
    with pytest.raises(RuntimeError, match="still going"):
        panel.launch()
    panel.stop()
    with pytest.raises(nbddp.RankError):
        panel.wait(60)


def test_code_for_a_lambda_nothing_holds_names_it_fn_and_says_so() -> None:
    panel = Panel(lambda: 1, namespace={})
    magic, call = panel.code()
    comment = "# define fn first: nbddp.panel was given a function (<lambda>)"
    assert call.startswith(comment) and call.endswith("\nresult = nbddp.launch(fn, procs=2)")
    assert magic.endswith("\nresult = fn()") and comment in magic
    assert "Define the names the comments list" in panel.view.code.value


class Weights:
    """An argument that is no literal: the code names it as the notebook does."""

    def __init__(self, total: int) -> None:
        self.total = total


def echo(steps: int, weights: Weights, *, lr: float = 0.1, tag: str = "plain") -> str:
    import os

    return f"{tag}: steps={steps} weights={weights.total} lr={lr} world={os.environ['WORLD_SIZE']}"


def test_keyword_arguments_typed_in_the_form_reach_the_function() -> None:
    w = Weights(6)
    panel = Panel(echo, (3, w), {"tag": "given"}, namespace={"echo": echo, "w": w})
    assert panel.view.kwargs.value == "tag='given'"  # literals start in the field
    panel.view.kwargs.value = "lr=0.5, tag='typed', epochs=2"
    assert "unexpected keyword argument &#x27;epochs&#x27;" in panel.view.errors["kwargs"].value
    assert panel.view.launch_button.disabled
    assert panel.view.launch_button.description == "Fix 1 field to launch"
    panel.view.kwargs.value = "lr=0.5, tag='typed'"
    panel.view.procs.value = "3"
    assert "<b>nbddp · echo(3, w, lr=0.5, tag=&#x27;typed&#x27;)</b>" in panel.view.title.value
    panel.launch()
    assert panel.wait(60).values[2] == "typed: steps=3 weights=6 lr=0.5 world=3"


def test_the_code_shown_runs_as_pasted_and_returns_the_same_value() -> None:
    w = Weights(6)
    notebook: dict[str, object] = {"echo": echo, "w": w, "nbddp": nbddp}
    panel = Panel(echo, (3, w), namespace=notebook)
    panel.view.kwargs.value = "lr=0.5, tag='pasted'"
    panel.view.timeout.value = "120"
    _, call = panel.code()
    assert call == "result = nbddp.launch(echo, 3, w, lr=0.5, tag='pasted', procs=2, timeout=120)"
    panel.launch()
    panel.wait(60)
    exec(call, notebook)  # a new cell of the same notebook
    assert notebook["result"] == panel.value == "pasted: steps=3 weights=6 lr=0.5 world=2"


def rows(n: int) -> dict[str, object]:
    import os

    return {"rank": int(os.environ["RANK"]), "rows": list(range(n))}


def test_the_value_is_shown_short_with_how_to_get_all_of_it() -> None:
    notebook: dict[str, object] = {}
    panel = Panel(rows, (1000,), namespace=notebook)
    notebook["p"] = panel  # p = nbddp.panel(rows, 1000)
    with pytest.raises(RuntimeError, match="nothing was launched"):
        panel.value  # noqa: B018
    panel.launch()
    panel.wait(60)
    assert panel.value == {"rank": 0, "rows": list(range(1000))}
    shown = panel.view.result.value
    assert "rank 0 returned <code" in shown and "…</code>" in shown and len(shown) < 1500
    assert "full value: p.value · every rank&#x27;s values and metrics: p.wait()" in shown
    # Not bound to a name: the kernel's output history holds it.
    notebook.clear()
    notebook["Out"] = {7: panel}
    panel.launch()
    panel.wait(60)
    assert "full value: Out[7].value" in panel.view.result.value


def test_the_value_of_a_run_still_going_says_to_wait() -> None:
    panel = Panel(steps, (1_000_000, 0.01))
    panel.launch()
    with pytest.raises(RuntimeError, match="still going; wait"):
        panel.value  # noqa: B018
    panel.stop()
    with pytest.raises(nbddp.RankError, match="stopped"):
        panel.wait(60)
    with pytest.raises(nbddp.RankError, match="stopped"):  # the run's own failure
        panel.value  # noqa: B018


def ask_on_rank_one() -> str:
    import os

    if os.environ["RANK"] == "1":
        return f"rank 1 got {input('batch size? ')}"
    return "rank 0 did not ask"


def test_a_rank_waiting_for_input_shows_its_prompt_and_the_answer_reaches_it() -> None:
    panel = Panel(ask_on_rank_one, ())
    panel.view.procs.value = "2"
    panel.view.launch_button.click()
    until(lambda: panel.view.prompt_box.layout.display is None)
    assert "batch size? [rank 1]" in panel.view.prompt_label.value
    until(lambda: 'data-state="waiting for input"' in panel.view.ranks.value)
    panel.view.prompt_input.value = "64"
    panel.view.prompt_send.click()
    result = panel.wait(60)
    assert result.values == {0: "rank 0 did not ask", 1: "rank 1 got 64"}
    assert panel.view.prompt_box.layout.display == "none"


def password_on_rank_one() -> str:
    import getpass
    import os

    return f"rank 1 got {getpass.getpass('Token: ')}" if os.environ["RANK"] == "1" else "-"


def test_a_password_prompt_hides_what_is_typed() -> None:
    import ipywidgets as W

    panel = Panel(password_on_rank_one, ())
    panel.view.procs.value = "2"
    panel.view.launch_button.click()
    until(lambda: panel.view.prompt_box.layout.display is None)
    assert "Token: [rank 1]" in panel.view.prompt_label.value
    assert isinstance(panel.view.prompt_input, W.Password)
    panel.view.prompt_input.value = "s3cret"
    panel.view.prompt_send.click()
    assert panel.wait(60).values == {0: "-", 1: "rank 1 got s3cret"}


def test_stop_while_a_rank_waits_for_input_ends_the_run() -> None:
    panel = Panel(ask_on_rank_one, ())
    panel.view.procs.value = "2"
    panel.view.launch_button.click()
    until(lambda: panel.view.prompt_box.layout.display is None)
    pids = list(panel.run.pids.values()) if panel.run is not None else []
    panel.view.stop_button.click()
    with pytest.raises(Exception):  # noqa: B017 - the run's own failure (stopped)
        panel.wait(60)
    assert shown_state(panel) == "stopped"
    assert panel.view.prompt_box.layout.display == "none"
    import psutil

    assert wait_procs_gone([psutil.Process(p) for p in pids if psutil.pid_exists(p)], 10) == []
