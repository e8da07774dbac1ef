"""The messages the troubleshooting page's tables quote (the ``message (start)``
column) are nbddp's: each is raised by a call here (``RAISED``, in this process, or
``IN_A_KERNEL``, as cells of one kernel), or asserted on the real error by the
test file ``ASSERTED_BY`` names, for those that need a Slurm cluster or a second
user. ``...`` and ``<...>`` in a quote stand for any text. A quote none of them
covers fails.
"""

from __future__ import annotations

import re
import threading
import types
from collections.abc import Callable
from pathlib import Path

import pytest

import nbddp
from tests.docs import error_fns as fns
from tests.docs.pages import ROOT
from tests.kernel.kernel import Kernel

PAGE = ROOT / "docs" / "troubleshooting.md"
SPAN = re.compile(r"`([^`]+)`")


def table_quotes() -> list[str]:
    """The quoted messages of the tables whose first column is ``message (start)``."""
    quotes, in_table = [], False
    for line in PAGE.read_text().splitlines():
        if line.startswith("| message (start) |"):
            in_table = True
        elif not line.startswith("|"):
            in_table = False
        elif in_table and not line.startswith("|---"):
            first = line.split(" | ")[0]
            quotes += [q for q in SPAN.findall(first) if " " in q]
    return quotes


def pattern(quote: str) -> re.Pattern[str]:
    parts = re.split(r"<[^<>]+>|\.\.\.", quote)
    return re.compile(".*?".join(re.escape(p) for p in parts), re.S)


def raised(call: Callable[[], object]) -> str:
    with pytest.raises(Exception) as info:
        call()
    return str(info.value)


def nul_env() -> None:
    nbddp.launch(fns.returns, procs=2, env={"X": "a\0b"})


def slurm_ended_before_it_started(mp: pytest.MonkeyPatch) -> None:
    from nbddp.cluster import slurm_alloc

    mp.setattr(slurm_alloc, "slurm", lambda *args: "CANCELLED|None")
    slurm_alloc._wait("42", None)


class NoAgents:
    """A Slurm step whose agents never connect: ``ended`` when ``srun`` failed."""

    def __init__(self, ended: bool) -> None:
        self.job, self.ended = "42", threading.Event()
        self.callers: dict[int, object] = {}
        if ended:
            self.ended.set()

    def why(self) -> str:
        return "Slurm: srun: error: Unable to create step"


def slurm_agents(mp: pytest.MonkeyPatch, ended: bool) -> None:
    import socket

    from nbddp.cluster import slurm_engine

    clock = iter([0.0, 1e9, 1e9])  # the 60 s deadline, then past it
    mp.setattr(slurm_engine, "time", types.SimpleNamespace(monotonic=lambda: next(clock)))
    with socket.socket() as server:
        slurm_engine._accept(server, "secret", 2, NoAgents(ended))  # type: ignore[arg-type]


def launch_with(mp: pytest.MonkeyPatch, name: str, value: str) -> None:
    mp.setenv(name, value)
    nbddp.launch(fns.returns, procs=2)


def a_file(tmp_path: Path) -> str:
    (tmp_path / "file").write_text("")
    return str(tmp_path / "file")


def working_dir_gone(mp: pytest.MonkeyPatch, tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    mp.chdir(gone)
    gone.rmdir()
    nbddp.launch(fns.returns, procs=2)


def no_ray(mp: pytest.MonkeyPatch) -> None:
    mp.setitem(__import__("sys").modules, "ray", None)
    nbddp.launch(fns.returns, nodes=2, procs=1, cluster="ray://head:10001")


def session_calls() -> list[str]:
    """The session's refusals, in one session's life."""
    said = []
    session = nbddp.session(procs=2)
    try:
        said.append(raised(session.start))  # already running
        raised(lambda: session.exec("import os\nos._exit(3) if rank == 1 else 0"))  # ends it
        said.append(raised(lambda: session.exec("x = 1")))  # it has ended
    finally:
        session.stop()
    said.append(raised(lambda: session.run(fns.returns)))  # none running
    return said


# A part of the quote -> a call (given pytest's monkeypatch and tmp_path) raising it.
RAISED: dict[str, Callable[[pytest.MonkeyPatch, Path], object]] = {
    "NBDDP_POOL='x'": lambda mp, tmp: launch_with(mp, "NBDDP_POOL", "x"),
    "is not a directory": lambda mp, tmp: launch_with(mp, "NBDDP_LOG_DIR", a_file(tmp)),
    "cannot be made": lambda mp, tmp: launch_with(mp, "NBDDP_LOG_DIR", a_file(tmp) + "/logs"),
    "working directory no longer exists": working_dir_gone,
    "contains a NUL byte": lambda mp, tmp: nul_env(),
    "a spawned rank could not start": lambda mp, tmp: nbddp.launch(
        fns.returns, procs=2, env={"BIG": "x" * 200_000}, start_method="spawn"
    ),
    "nodes=2 needs a cluster: add": lambda mp, tmp: nbddp.launch(fns.returns, nodes=2, procs=1),
    "num_nodes=2 needs a cluster": lambda mp, tmp: nbddp.notebook_launcher(
        fns.returns, num_processes=1, num_nodes=2
    ),
    "needs Ray: pip install": lambda mp, tmp: no_ray(mp),
    "max_restarts does not apply": lambda mp, tmp: nbddp.session(procs=2, max_restarts=1),
    "debug=True needs block=True": lambda mp, tmp: nbddp.launch(
        fns.returns, procs=2, debug=True, block=False
    ),
    "ended before it started": lambda mp, tmp: slurm_ended_before_it_started(mp),
    "did not connect within": lambda mp, tmp: slurm_agents(mp, ended=False),
    "could not start nbddp's agents": lambda mp, tmp: slurm_agents(mp, ended=True),
}
# Produced together by ``session_calls``, in its order.
IN_A_SESSION = [
    "the session is already running",
    "the session has ended (<why>)",
    "no session is running; start one first",
]
# Cells of one kernel, in order: a quote's part -> the cell whose error says it.
IN_A_KERNEL: dict[str, str] = {
    "%ddp_debug: no session is running": "%ddp_debug",
    "%ddp_session <verb>: no session is running": "%ddp_session stop",
    "%%ddp: the cell is empty": "%%ddp --procs 2\n# nothing here yet\n",
    "but it cannot be rebuilt in the notebook": (
        "%%ddp --procs 2 --out value\n"
        "from tests.docs.error_fns import cell_value_unrebuildable\n"
        "value = cell_value_unrebuildable()"
    ),
    "%ddp_session start: a session is already running": "%ddp_session start --procs 2",
    "%%ddp --no-init": "%%ddp --no-init\nx = 1",
    "nothing to debug": "%ddp_debug",
    "this cell's options differ": "%%ddp --procs 3\nx = 1",
    "%%ddp: the session has ended": "%%ddp\nimport os\nos._exit(3) if rank == 1 else 0",
}
# Quoted in the page's prose, not in a table.
KERNEL_PROSE = [
    "this cell's options differ from the session's (...); drop them (the session's apply), "
    "or %ddp_session stop to run one-shot cells"
]
KERNEL_SETUP = ["%load_ext nbddp", "%ddp_session start --procs 2", "%%ddp\nx = 1"]
# Asserted on the real error by these tests (a Slurm cluster; a directory of another user).
ASSERTED_BY: dict[str, str] = {
    "is not yours": "tests/unit/test_logs.py",
    "runs in none": "tests/slurm/test_slurm.py",
    "needs Slurm's srun on PATH": "tests/slurm/test_slurm.py",
    "needs 3 nodes, but Slurm job": "tests/slurm/test_slurm.py",
    "GPUs per node, but Slurm gave": "tests/slurm/test_slurm.py",
    "Slurm refused the allocation": "tests/slurm/test_allocate.py",
    "pending (": "tests/slurm/test_allocate.py",
    "is gone; Slurm job": "tests/slurm/test_lost.py",
    "another cell of this session is still running": "tests/multiproc/test_session.py",
    "did not raise in the last cell": "tests/kernel/test_debug_kernel.py",
}


def covering(quote: str) -> list[str]:
    keys = [*RAISED, *IN_A_SESSION, *IN_A_KERNEL, *ASSERTED_BY]
    return [key for key in keys if key in quote]


def test_every_table_quote_is_covered_once() -> None:
    quotes = table_quotes()
    assert len(quotes) > 30, quotes
    for quote in quotes:
        assert len(covering(quote)) == 1, f"{quote!r} is covered by {covering(quote)}"


@pytest.mark.parametrize("key", list(RAISED))
def test_the_quote_is_raised(key: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (quote,) = [q for q in table_quotes() if key in q]
    said = raised(lambda: RAISED[key](monkeypatch, tmp_path))
    assert pattern(quote).search(said), f"the page quotes\n  {quote}\nnbddp says\n  {said}"


def test_the_session_quotes_are_raised() -> None:
    for key, said in zip(IN_A_SESSION, session_calls(), strict=True):
        (quote,) = [q for q in table_quotes() if key in q]
        assert pattern(quote).search(said), f"the page quotes\n  {quote}\nnbddp says\n  {said}"


@pytest.mark.timeout(240)
def test_the_magic_quotes_are_what_the_cells_say() -> None:
    with Kernel(cwd=str(ROOT)) as kernel:
        for step, (key, cell) in enumerate(IN_A_KERNEL.items()):
            if step == 4:  # the rest in a session
                for setup in KERNEL_SETUP[1:]:
                    assert kernel.execute(setup).status == "ok"
            elif step == 0:
                assert kernel.execute(KERNEL_SETUP[0]).status == "ok"
            result = kernel.execute(cell)
            if key == "%%ddp: the session has ended":
                result = kernel.execute("%%ddp\nx = 1")  # the cell after the rank died
            # An error, or IPython's one-line UsageError (on stderr).
            said = result.error["evalue"] if result.error else result.stderr
            assert said, f"{cell!r} did not fail:\n{result.text()}"
            (quote,) = [q for q in table_quotes() + KERNEL_PROSE if key in q]
            assert pattern(quote).search(said), f"the page quotes\n  {quote}\nnbddp says\n  {said}"
        kernel.execute("%ddp_session stop")
    page = " ".join(PAGE.read_text().split())
    assert all(quote in page for quote in KERNEL_PROSE), "update KERNEL_PROSE"


@pytest.mark.parametrize("key", list(ASSERTED_BY))
def test_the_quote_is_asserted_by_its_test(key: str) -> None:
    source = (ROOT / ASSERTED_BY[key]).read_text()
    assert key in source, f"{ASSERTED_BY[key]} does not assert {key!r}"
