"""Session rules that need no process: which names a cell binds, whose names win,
which options a cell of a session may give."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from nbddp.errors import CellError, ConfigError
from nbddp.notebook.program import build_program
from nbddp.notebook.runner import CellRunner
from nbddp.notebook.session import Session
from nbddp.rank import context
from nbddp.rank import session as rank_session
from nbddp.rank.cell import CellProgram, CellValues, names_bound
from nbddp.wire.protocol import Placement


def test_names_bound_are_every_top_level_binding_even_conditional() -> None:
    source = (
        "import torch\nfrom os import path as p\nmodel = f(x)\n"
        "if flag:\n    late = 1\nfor i in range(3):\n    pass\n"
        "def helper():\n    inner = 2\nclass Net: pass\n"
        "with open(f) as fh: pass\ny += 1\nprint(z)\n"
    )
    assert names_bound(source) == {
        "torch", "p", "model", "late", "i", "helper", "Net", "fh", "y"
    }  # fmt: skip


@pytest.fixture
def in_session_rank() -> Iterator[rank_session.SessionState]:
    """This process as rank 0 of a session (context and state as ``serve`` sets them)."""
    context.install(Placement(0, 0, 2, 2, "cpu"))
    state = rank_session.SessionState()
    rank_session._STATE = state
    yield state
    rank_session._STATE = None
    context.install(None)


def _cell(source: str, **names: Any) -> CellProgram:
    return build_program(
        source, header="%%ddp", filename="<ddp cell [1]>", user_ns=names, session=True
    )


def _last(values: CellValues | None) -> Any:
    assert values is not None
    return values.restore()[1]


def test_a_name_a_session_cell_bound_is_never_replaced_by_the_notebooks(
    in_session_rank: rank_session.SessionState,
) -> None:
    assert _last(_cell("model = 'the ranks'\nmodel")()) == "the ranks"
    assert "model" in in_session_rank.owned
    # The notebook has its own ``model``: even if it were sent, the rank's stays.
    assert _last(CellProgram("model", "%%ddp", "<c>", {"model": "notebook"}, session=True)()) == (
        "the ranks"
    )


def test_a_name_only_read_is_sent_fresh_each_cell(
    in_session_rank: rank_session.SessionState,
) -> None:
    assert _last(_cell("helper()", helper=lambda: 1)()) == 1
    assert _last(_cell("helper()", helper=lambda: 2)()) == 2  # edited in the notebook
    assert "helper" not in in_session_rank.owned


def test_a_sent_name_kept_as_is_stays_the_notebooks_and_a_rebound_one_becomes_the_ranks(
    in_session_rank: rank_session.SessionState,
) -> None:
    _cell("lr = lr", lr=0.1)()
    assert "lr" not in in_session_rank.owned  # the same object: still the notebook's
    _cell("lr = lr * 2", lr=0.1)()
    assert "lr" in in_session_rank.owned


def test_names_a_failing_cell_bound_before_it_failed_are_the_ranks(
    in_session_rank: rank_session.SessionState,
) -> None:
    with pytest.raises(ZeroDivisionError):
        _cell("done = 1\n1 / 0\nnever = 2")()
    assert "done" in in_session_rank.owned and "never" not in in_session_rank.owned


def _runner_with(options: dict[str, Any]) -> tuple[CellRunner, Session]:
    runner = CellRunner()
    session = Session(options)  # not started: the option rules need no ranks
    runner.session = session
    return runner, session


def test_a_session_cell_may_set_its_own_timeout_and_output_only() -> None:
    runner, session = _runner_with({"procs": 2})
    session._job = _Alive()  # type: ignore[assignment]
    config = runner.session_cell_config(session, {"timeout": 5, "output": "rank0"}, init=True)
    assert (config.job.timeout, config.view.output, config.job.world_size) == (5, "rank0", 2)
    assert runner.session_cell_config(session, {"procs": 2}, init=True).job.world_size == 2
    with pytest.raises(CellError, match=r"--procs 3: this cell's options differ .*\(--procs 2\)"):
        runner.session_cell_config(session, {"procs": 3}, init=True)
    with pytest.raises(CellError, match="--no-init"):
        runner.session_cell_config(session, {}, init=False)


def test_a_session_cell_after_the_session_ended_says_what_to_do() -> None:
    runner, session = _runner_with({"procs": 2})
    with pytest.raises(CellError, match="the session has ended"):
        runner.session_cell_config(session, {}, init=True)


def test_stop_or_restart_without_a_session_is_a_one_line_error() -> None:
    runner = CellRunner()
    for verb in (runner.stop_session, runner.restart_session):
        with pytest.raises(CellError, match="no session is running; %ddp_session start"):
            verb()
    assert "no session" in runner.describe_session()


class _Alive:
    """Stands for a running session's job."""

    alive = True
    names: tuple[str, ...] = ()


def test_a_name_the_ranks_deleted_is_the_notebooks_again(
    in_session_rank: rank_session.SessionState,
) -> None:
    _cell("x = 1")()
    _cell("del x")()
    assert "x" not in in_session_rank.owned
    assert _last(_cell("x", x="notebook")()) == "notebook"


def test_a_session_on_a_cluster_is_refused_before_anything_starts() -> None:
    with pytest.raises(ConfigError, match="a session runs on this machine"):
        Session({"procs": 2, "nodes": 2, "cluster": "ray://head:10001"})
