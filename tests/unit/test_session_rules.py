"""Session rules that need no process: which names a cell binds, whose names win,
what stays after a cell, which options a cell of a session may give."""

from __future__ import annotations

import gc
import os
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

from nbddp.errors import CellError
from nbddp.notebook.program import build_program, definitions_read
from nbddp.notebook.runner import CellRunner
from nbddp.notebook.session import Session
from nbddp.rank import context
from nbddp.rank import session_loop as rank_session
from nbddp.rank.cell import CellProgram, CellValues
from nbddp.rank.namespace import Namespace
from nbddp.wire.protocol import Placement


@pytest.fixture
def in_session_rank() -> Iterator[rank_session.SessionState]:
    """This process as rank 0 of a session (as ``serve_session_rank`` sets it up)."""
    context.install(Placement(0, 0, 2, "cpu"))
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
    assert "model" in in_session_rank.space.owned
    # The notebook has its own ``model``: even if it were sent, the rank's stays.
    assert _last(CellProgram("model", "%%ddp", "<c>", {"model": "notebook"}, session=True)()) == (
        "the ranks"
    )


def test_a_name_only_read_is_sent_fresh_each_cell(
    in_session_rank: rank_session.SessionState,
) -> None:
    assert _last(_cell("helper()", helper=lambda: 1)()) == 1
    assert _last(_cell("helper()", helper=lambda: 2)()) == 2  # edited in the notebook
    assert "helper" not in in_session_rank.space.owned


def test_a_sent_name_kept_as_is_stays_the_notebooks_and_a_rebound_one_becomes_the_ranks(
    in_session_rank: rank_session.SessionState,
) -> None:
    _cell("lr = lr", lr=0.1)()
    assert "lr" not in in_session_rank.space.owned  # the same object: still the notebook's
    _cell("lr = lr * 2", lr=0.1)()
    assert "lr" in in_session_rank.space.owned


def test_names_a_failing_cell_bound_before_it_failed_are_the_ranks(
    in_session_rank: rank_session.SessionState,
) -> None:
    with pytest.raises(ZeroDivisionError):
        _cell("done = 1\n1 / 0\nnever = 2")()
    assert "done" in in_session_rank.space.owned and "never" not in in_session_rank.space.owned


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
    assert "x" not in in_session_rank.space.owned
    assert _last(_cell("x", x="notebook")()) == "notebook"


def test_a_session_across_a_clusters_nodes_is_configured_without_starting() -> None:
    session = Session({"procs": 2, "nodes": 2, "cluster": "ray://head:10001"})
    assert session.config.cluster is not None and session.config.job.world_size == 4
    assert not session.alive


class _Value:
    """A notebook value whose going can be watched (``weakref``)."""


def test_a_notebook_value_a_cell_only_read_is_dropped_after_the_cell(
    in_session_rank: rank_session.SessionState,
) -> None:
    value = _Value()
    gone = weakref.ref(value)
    assert _last(_cell("type(big).__name__", big=value)()) == "_Value"
    assert "big" not in in_session_rank.space.globals
    del value
    gc.collect()
    assert gone() is None  # nothing on the rank refers to it
    with pytest.raises(NameError, match="big"):
        _cell("big")()


def test_a_value_a_cell_kept_a_reference_to_stays_with_the_object_that_keeps_it(
    in_session_rank: rank_session.SessionState,
) -> None:
    _cell("box = [big]", big=_Value())()
    assert "big" not in in_session_rank.space.globals
    assert _last(_cell("type(box[0]).__name__")()) == "_Value"


def test_the_names_read_inside_definitions_are_sent_with_later_cells() -> None:
    source = (
        "def step():\n    return lr * scale(x)\n"
        "class Net:\n    def forward(self):\n        return weight\n"
        "f = lambda: bias\n"
        "total = sum(v * once for v in values)\n"
    )
    assert definitions_read(source) == {"lr", "scale", "x", "weight", "bias"}


def test_a_function_from_the_notebook_runs_in_the_session_namespace() -> None:
    notebook: dict[str, Any] = {"__name__": "__main__", "scale": 10}
    exec(
        "def setup(v):\n    global state\n    state = v * scale\n"
        "def read():\n    return state + helper()\n"
        "def helper():\n    return 1\n",
        notebook,
    )
    space = Namespace()
    space.run(notebook["setup"], (4,), {})
    assert space.globals["state"] == 40 and space.owned == {"state"}
    assert "scale" not in space.globals  # read from the notebook, dropped after
    assert space.run(notebook["read"], (), {}) == 41
    assert "state" not in notebook  # the notebook's own globals are untouched
    # A function from a module keeps its module's globals.
    assert space.run(os.path.join, ("a", "b"), {}) == "a/b"
    assert space.owned == {"state"}


def test_a_notebook_value_a_kept_function_reads_stays_until_the_notebook_drops_it(
    in_session_rank: rank_session.SessionState,
) -> None:
    _cell("def handler():\n    return path", path="/tmp/a")()
    # Between cells (a signal handler, a thread), the function still finds it.
    assert in_session_rank.space.globals["handler"]() == "/tmp/a"
    later = {"header": "%%ddp", "filename": "<ddp cell [2]>", "session": True, "also": {"path"}}
    assert _last(build_program("handler()", user_ns={"path": "/tmp/b"}, **later)()) == "/tmp/b"
    build_program("1", user_ns={}, **later)()  # the notebook deleted it
    assert "path" not in in_session_rank.space.globals
    with pytest.raises(NameError, match="path"):
        in_session_rank.space.globals["handler"]()
