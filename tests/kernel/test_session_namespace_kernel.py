"""A session's namespace in a real kernel: notebook names a cell read are the cell's,
``Session.run`` shares the cell's namespace, and ``sys.exit`` is an nbddp error.

One kernel with the extension loaded; each test starts its session and stops it
(the conftest fixture checks that nothing is left).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.kernel.kernel import Kernel, ok
from tests.kernel.test_session_kernel import KEPT, failed, per_rank, start_session, traceback_of
from tests.procs import wait_gone


@pytest.fixture
def shared(notebook: Kernel) -> Iterator[Kernel]:
    pids = start_session(notebook)
    yield notebook
    ok(notebook, "%ddp_session stop")
    assert wait_gone(pids=set(pids.values())) == []


def test_a_name_deleted_in_the_notebook_is_undefined_on_the_ranks(shared: Kernel) -> None:
    ok(shared, "lr_adv = 0.5")
    assert per_rank(ok(shared, "%%ddp\nprint('LR', lr_adv)"), "LR") == {0: "0.5", 1: "0.5"}
    ok(shared, "del lr_adv")
    result = failed(shared, "%%ddp\nprint('LR', lr_adv)")
    assert result.error is not None and result.error["ename"] == "NameError", result.text()
    assert "name 'lr_adv' is not defined" in traceback_of(result)
    names = ok(shared, "%ddp_session").stdout
    assert "lr_adv" not in names


def test_sys_exit_on_one_rank_is_an_nbddp_error_and_the_state_is_kept(shared: Kernel) -> None:
    ok(shared, "%%ddp\nkept_value = 41")
    result = failed(shared, "%%ddp\nimport sys\nif rank == 1:\n    sys.exit(3)")
    assert result.error is not None
    assert result.error["ename"] == "RankExitedError", result.text()
    shown = traceback_of(result)
    assert "rank 1 called sys.exit(3)" in shown, shown
    assert KEPT in shown, shown
    assert "To exit: use 'exit'" not in result.text()
    assert "SystemExit" not in result.error["ename"]
    # The same ranks go on, with their state.
    assert ok(shared, "%%ddp\nkept_value + 1").result == "42"


def test_functions_given_to_run_share_the_sessions_namespace(notebook: Kernel) -> None:
    ok(notebook, "import nbddp\ns = nbddp.session(procs=2, output='none')")
    try:
        ok(
            notebook,
            "def setup():\n"
            "    global model_state\n"
            "    model_state = {'step': 1}\n"
            "def train():\n"
            "    model_state['step'] += 1\n"
            "    return model_state['step']",
        )
        ok(notebook, "s.run(setup)")
        assert ok(notebook, "s.run(train)").result == "2"
        assert ok(notebook, "s.run(train)").result == "3"
        assert ok(notebook, "'model_state' in s.names").result == "True"
        # The notebook has no model_state: only the ranks do.
        assert ok(notebook, "'model_state' in globals()").result == "False"
    finally:
        ok(notebook, "s.stop()")
