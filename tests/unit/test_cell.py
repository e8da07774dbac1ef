"""The %%ddp cell program, in process: name analysis, compilation, and one rank's run."""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import torch

from nbddp.errors import CellError
from nbddp.notebook.program import build_program, is_quiet, names_read, select_names
from nbddp.rank import cell, context, worker
from nbddp.rank.cell import CellProgram, CellValues, compile_cell
from nbddp.rank.errors import is_ours
from nbddp.wire.protocol import DeviceKind, Placement


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("y = x + 1", {"x"}),
        ("print(a.b.c)", {"print", "a"}),  # attribute names are not names
        ("x = 1\ny = x", set()),  # bound by the cell before it is read
        ("x = x + 1", {"x"}),  # read before the binding
        ("x += 1", {"x"}),
        ("def f(v):\n    return v + w\n", {"w"}),  # parameters are not reads
        ("class C:\n    z = q\n    def m(self):\n        return r\n", {"q", "r"}),
        ("out = [i * k for i in data if i > t]", {"data", "k", "t"}),
        ("g = lambda u: u + v", {"v"}),
        ("import numpy as np\nnp.zeros(1)", set()),
        ("def f():\n    return model\nmodel = 1\nf()", {"model"}),  # mentioned first
        ("if cond:\n    m = 1\nprint(m)", {"cond", "m", "print"}),  # conditional binding
        ("def f():\n    global n\n    n = 1\n", set()),  # written, not read
        ("def f():\n    global n\n    n += 1\n", {"n"}),
        ("for i in range(3):\n    total = i\n", {"range"}),  # its own loop variable
        ("for i in range(3):\n    pass\nprint(i)", {"range", "print", "i"}),  # maybe unbound
        ("with open(p) as fh:\n    text = fh.read()\n", {"open", "p"}),
    ],
)
def test_names_read(source: str, expected: set[str]) -> None:
    assert names_read(source) == expected


def test_select_names_skips_ipython_internals() -> None:
    user_ns = {
        "data": 1,
        "In": [],
        "Out": {},
        "_": 3,
        "__": 4,
        "_i": "",
        "_i7": "",
        "_7": 5,
        "_oh": {},
        "get_ipython": print,
        "exit": None,
        "__name__": "__main__",
        "open": open,
        "_private": 6,
    }
    names = set(user_ns) | {"missing"}
    assert select_names(user_ns, names, hidden={"open"}) == {"data": 1, "_private": 6}


@pytest.mark.parametrize(
    ("source", "quiet"),
    [("x", False), ("x;", True), ("x;  # comment\n\n", True), ("x  # ;", False), ("", False)],
)
def test_is_quiet(source: str, quiet: bool) -> None:
    assert is_quiet(source) is quiet


def test_compile_cell_splits_the_last_expression_and_keeps_line_numbers() -> None:
    body, expr = compile_cell("a = 1\na + 1\n", "<ddp cell [1]>")
    ns: dict[str, object] = {}
    exec(body, ns)
    assert expr is not None and eval(expr, ns) == 2
    lines = {line for *_, line in body.co_lines() if line}
    assert min(lines) == 2  # line 1 is the %%ddp line
    _, quiet_expr = compile_cell("a = 1\na + 1;\n", "<x>", quiet=True)
    assert quiet_expr is None


def test_compile_cell_rejects_empty_and_invalid_cells() -> None:
    with pytest.raises(CellError, match="the cell is empty"):
        compile_cell("# only a comment\n", "<x>")
    with pytest.raises(SyntaxError) as info:
        compile_cell("x = 1\nx = = 2\n", "<ddp cell [4]>")
    assert info.value.lineno == 3 and info.value.filename == "<ddp cell [4]>"


def place(rank: int, device: DeviceKind = "cpu", cuda_index: int | None = None) -> Placement:
    return Placement(
        rank=rank,
        local_rank=rank,
        world_size=2,
        device=device,
        cuda_index=cuda_index,
    )


@pytest.fixture
def rank_context() -> Iterator[Callable[[Placement], None]]:
    """Installs a rank's context as the worker does; removed after the test."""
    yield context.install
    context.install(None)


@pytest.fixture
def rank0(rank_context: Callable[[Placement], None]) -> None:
    rank_context(place(0))


def program(source: str, out: tuple[str, ...] = (), **user_ns: object) -> CellProgram:
    return build_program(
        source,
        header="%%ddp --procs 2",
        filename="<ddp cell [9]>",
        user_ns=user_ns,
        out=out,
    )


def test_program_ships_only_the_names_the_cell_reads() -> None:
    prog = program("y = helper(data)", helper=len, data=[1, 2], unused=threading.Lock())
    assert prog.names == {"helper": len, "data": [1, 2]}


@pytest.mark.usefixtures("rank0")
def test_program_runs_the_cell_on_rank_0() -> None:
    source = (
        "def f():\n"
        "    return g() + offset\n"
        "def g():\n"
        "    return 1\n"
        "state = {'w': torch.ones(2) * f()}\n"
        "seen = (rank, local_rank, world_size, str(device))\n"
        "np.sum(data) + f()\n"
    )
    prog = program(source, out=("state", "seen"), torch=torch, np=np, data=np.arange(3), offset=10)
    values = prog()
    assert isinstance(values, CellValues)
    out, last = values.restore()
    assert last == 3 + 11
    assert out["seen"] == (0, 0, 2, "cpu")
    assert torch.equal(out["state"]["w"], torch.full((2,), 11.0))


def test_program_returns_nothing_on_other_ranks(
    rank_context: Callable[[Placement], None],
) -> None:
    rank_context(place(1))
    assert program("x = rank\nx", out=("x",))() is None


def test_program_takes_rank_and_device_from_the_context_not_the_environment(
    rank_context: Callable[[Placement], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "5")  # the user's environment; the order's values win
    monkeypatch.setenv("WORLD_SIZE", "9")
    rank_context(Placement(rank=0, local_rank=1, world_size=4, device="cuda", cuda_index=1))
    values = program("(rank, local_rank, world_size, str(device))")()
    assert isinstance(values, CellValues)
    assert values.restore()[1] == (0, 1, 4, "cuda:1")


def test_program_outside_a_rank_says_so() -> None:
    with pytest.raises(RuntimeError, match="not inside a rank launched by nbddp"):
        program("rank")()


def test_the_cell_programs_frame_is_left_out_of_the_ranks_traceback() -> None:
    # error_info drops the leading frames that are nbddp's own: the worker's
    # and the cell program's (which runs the cell), not the user's.
    assert is_ours(worker.__file__)
    assert is_ours(cell.__file__)
    assert not is_ours(__file__)


@pytest.mark.usefixtures("rank0")
def test_program_traceback_shows_the_cells_line() -> None:
    prog = program("x = 1\nraise ValueError('boom')\n")
    with pytest.raises(ValueError) as info:
        prog()
    text = "".join(traceback.format_exception(info.value))
    assert 'File "<ddp cell [9]>", line 3, in <module>' in text
    assert "raise ValueError('boom')" in text


@pytest.mark.usefixtures("rank0")
def test_program_out_name_not_defined() -> None:
    with pytest.raises(NameError, match="--out missing"):
        program("x = 1", out=("missing",))()


@pytest.mark.usefixtures("rank0")
def test_program_out_value_that_cannot_be_sent() -> None:
    with pytest.raises(TypeError, match="--out lock: lock cannot be sent"):
        program("import threading\nlock = threading.Lock()", out=("lock",))()


@pytest.mark.usefixtures("rank0")
def test_unpicklable_last_value_is_shown_by_its_repr() -> None:
    values = program("import threading\nthreading.Lock()")()
    assert isinstance(values, CellValues)
    _, last = values.restore()
    assert repr(last).startswith("<unlocked _thread.lock object")
