"""Notebook sources travel with the code written in them, and cells are named as IPython
names them: in the payload, in a rank's tracebacks, and for a ``%%ddp`` cell."""

from __future__ import annotations

import linecache
import traceback
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import cloudpickle
import pytest

from nbddp.notebook.runner import notebook_cell
from nbddp.rank.errors import error_info
from nbddp.wire import sources
from nbddp.wire.payload import Payload, load_call

CELL_FILE = "/tmp/ipykernel_4242/1799617893.py"
CELL = """\
import math

def f(x):
    y = x + 1
    if y > 2:
        raise ValueError(f"bad {x}")
    return math.sqrt(y)
"""


@dataclass
class FakeCompiler:
    """IPython's ``CachingCompiler`` as far as naming goes: filename -> cell number."""

    numbers: dict[str, int] = field(default_factory=dict)

    def format_code_name(self, name: str) -> tuple[str, str] | None:
        number = self.numbers.get(name)
        return None if number is None else ("Cell", f"In[{number}]")


@dataclass
class FakeShell:
    compile: FakeCompiler
    execution_count: int = 7  # IPython 9 counts the running cell before it runs


@pytest.fixture
def notebook(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeShell]:
    """A notebook whose cell [6] is ``CELL`` (in ``linecache`` only, as IPython keeps
    it), with IPython's shell found as a notebook's is."""
    shell = FakeShell(FakeCompiler({CELL_FILE: 6}))
    fake_ipython = type("IPython", (), {"get_ipython": staticmethod(lambda: shell)})
    monkeypatch.setitem(__import__("sys").modules, "IPython", fake_ipython)
    lines = CELL.splitlines(keepends=True)
    linecache.cache[CELL_FILE] = (len(CELL), None, lines, CELL_FILE)
    yield shell
    linecache.cache.pop(CELL_FILE, None)
    sources._SHOWN.pop(CELL_FILE, None)


def cell_function() -> Callable[[int], float]:
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(compile(CELL, CELL_FILE, "exec"), namespace)
    return namespace["f"]  # type: ignore[no-any-return]


def as_in_a_rank(payload: Payload) -> Callable[..., Any]:
    """The call as a rank rebuilds it: in a process that has neither the cell's lines
    nor its name until the payload brings them."""
    linecache.cache.pop(CELL_FILE, None)
    sources._SHOWN.pop(CELL_FILE, None)
    call = load_call(payload.ref())
    return lambda: call.fn(*call.args, **call.kwargs)


def test_a_cells_function_takes_its_source_and_name_with_it(notebook: FakeShell) -> None:
    payload = Payload.serialize(cell_function(), (5,), {})
    call = as_in_a_rank(payload)
    with pytest.raises(ValueError) as raised:
        call()
    info = error_info(raised.value)
    assert "  Cell In[6], line 6, in f\n" in info.traceback
    assert '    raise ValueError(f"bad {x}")\n' in info.traceback
    assert CELL_FILE not in info.traceback


NESTED = """\
class Model:
    def step(self, x):
        def check(value):
            if value > 2:
                raise ValueError(f"bad {value}")
        check(x + 1)
"""


@pytest.fixture(params=["as installed", "renamed"])
def code_file_names(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """cloudpickle as installed (3.1.3 and later name every code object's file
    ``<dynamic-code>``), or one that pickles every code object under another file name."""
    if request.param == "renamed":
        table = cloudpickle.Pickler.dispatch_table
        reduce_code = table[types.CodeType]

        def renamed(code: types.CodeType) -> Any:
            return reduce_code(code.replace(co_filename="<elsewhere>"))

        monkeypatch.setitem(table, types.CodeType, renamed)
    return str(request.param)


def test_nested_code_keeps_its_cells_lines_whatever_file_cloudpickle_names(
    notebook: FakeShell, code_file_names: str
) -> None:
    linecache.cache[CELL_FILE] = (len(NESTED), None, NESTED.splitlines(True), CELL_FILE)
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(compile(NESTED, CELL_FILE, "exec"), namespace)
    model = namespace["Model"]()
    call = as_in_a_rank(Payload.serialize(model.step, (2,), {}))
    with pytest.raises(ValueError) as raised:
        call()
    shown = error_info(raised.value).traceback
    assert "  Cell In[6], line 6, in step\n    check(x + 1)\n" in shown
    assert '  Cell In[6], line 5, in check\n    raise ValueError(f"bad {value}")\n' in shown
    assert "<dynamic-code>" not in shown and "<elsewhere>" not in shown


def test_only_files_that_exist_in_linecache_alone_are_sent(notebook: FakeShell) -> None:
    fn = cell_function()
    # Reached through a closure, once however often it is referred to.
    (sent,) = _sources_of(Payload.serialize(lambda: (fn(1), fn(2)), (fn,), {}))
    assert sent.filename == CELL_FILE and sent.shown == "Cell In[6]"
    assert "".join(sent.lines) == CELL
    # A module's function (its file is on disk, and the rank reads it there): nothing.
    assert _sources_of(Payload.serialize(traceback.format_exc, (), {})) == ()


def _sources_of(payload: Payload) -> tuple[sources.Source, ...]:
    return load_call(payload.ref()).sources


def test_frames_of_named_files_are_headed_as_ipython_heads_them() -> None:
    sources.register([sources.Source("<x>", ("a = 1\n",), "Cell In[3]")])
    text = 'Traceback:\n  File "<x>", line 1, in <module>\n  File "<y>", line 2, in g\n'
    assert sources.named(text) == (
        'Traceback:\n  Cell In[3], line 1, in <module>\n  File "<y>", line 2, in g\n'
    )
    # Inside an exception group's box, too.
    assert sources.named('  |   File "<x>", line 1, in f\n') == "  |   Cell In[3], line 1, in f\n"


def test_the_ddp_cell_is_named_by_the_cell_that_runs_it_not_the_count(
    notebook: FakeShell,
) -> None:
    # The cell's own code runs the magic (IPython compiled it under CELL_FILE, as
    # cell 6); the shell's count is already 7 by then.
    namespace = {"notebook_cell": notebook_cell, "shell": notebook}
    exec(compile("name = notebook_cell(shell)", CELL_FILE, "exec"), namespace)
    name = namespace["name"]
    assert (name.filename, name.shown) == ("<ddp cell [6]>", "Cell In[6]")


def test_a_ddp_cell_run_outside_a_cell_keeps_the_count_and_no_name() -> None:
    name = notebook_cell(FakeShell(FakeCompiler()))
    assert (name.filename, name.shown) == ("<ddp cell [7]>", None)
