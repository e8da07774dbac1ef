"""The layout's rules: a module's place says which process runs it, and imports keep to that.

Packages by process: ``forkserver`` (the forkserver and the keepers of ranks),
``rank`` (the rank), ``wire`` (crosses processes: every process may load it),
``agent`` (a cluster node's agent, which runs the launcher there), and the
notebook side: ``launcher``, ``display``, ``notebook``, ``cluster`` and
``entry`` and ``prewarm``. ``prctl`` and ``errors`` are leaves every process may load.

Checked here from the source (every import, also inside functions):

- the forkserver, rank and wire sides import nothing of the notebook side and
  no front end (IPython, ipykernel, ipywidgets) or ray;
- the launcher imports neither the display, the notebook package, the cluster
  package nor the entry points: they depend on it, never the reverse;
- front ends are imported only inside functions on the notebook side, ray only
  inside functions and only in ``cluster`` and ``agent``;
- the agent side imports nothing of the notebook's cluster side, the front ends or
  the displays;
- no import cycle among nbddp's modules, even through imports inside functions.

And in a fresh interpreter, by what it has in ``sys.modules``: the
forkserver's boot and preload, a spawned keeper's import, ``import nbddp``.
What a rank has loaded is checked with real ranks in
``tests/multiproc/test_loaded_modules.py``.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterable
from pathlib import Path

import pytest

import nbddp

PACKAGE = Path(nbddp.__file__).parent
FRONTEND = ("IPython", "ipykernel", "ipywidgets")
NOTEBOOK_SIDE = (
    "nbddp.launcher",
    "nbddp.notebook",
    "nbddp.display",
    "nbddp.cluster",
    "nbddp.entry",
    "nbddp.prewarm",
)
PROCESS_SIDE = ("nbddp.forkserver", "nbddp.rank", "nbddp.wire", "nbddp.prctl", "nbddp.errors")
"""What the forkserver, keepers and ranks may load of nbddp (with ``nbddp`` itself)."""


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


ALL = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(path: Path, *, top_level_only: bool = False) -> set[str]:
    """Every module ``path`` imports (relative imports resolved), with the names it
    takes from each (``a.b`` for ``from a import b``)."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package[: len(package) - node.level + 1], *[base] * bool(base)])
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def under(name: str, prefixes: Iterable[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def modules(*prefixes: str) -> list[Path]:
    return [path for name, path in ALL.items() if under(name, prefixes)]


@pytest.mark.parametrize(
    "path", modules("nbddp.forkserver", "nbddp.rank", "nbddp.wire", "nbddp.prctl"), ids=module_name
)
def test_what_runs_outside_the_notebook_imports_nothing_of_its_side(path: Path) -> None:
    bad = {n for n in imports(path) if under(n, (*NOTEBOOK_SIDE, *FRONTEND, "ray"))}
    assert not bad, f"{module_name(path)} imports {sorted(bad)}"


@pytest.mark.parametrize("path", modules("nbddp.launcher"), ids=module_name)
def test_the_launcher_depends_on_no_display_notebook_cluster_or_entry_point(path: Path) -> None:
    above = ("nbddp.display", "nbddp.notebook", "nbddp.cluster", "nbddp.entry", "nbddp.prewarm")
    bad = {n for n in imports(path) if under(n, above)}
    assert not bad, f"{module_name(path)} imports {sorted(bad)}"


# The magics and the panel are the front ends' own modules, imported only when used.
NOT_FRONTEND = [
    p
    for p in modules("nbddp")
    if p.parent.name != "panel" and p.name != "magics.py" and p.name != "view.py"
]


@pytest.mark.parametrize("path", NOT_FRONTEND, ids=module_name)
def test_front_ends_are_imported_only_inside_functions(path: Path) -> None:
    bad = {n for n in imports(path, top_level_only=True) if under(n, FRONTEND)}
    assert not bad, f"{module_name(path)} imports {sorted(bad)} at import time"


@pytest.mark.parametrize("path", modules("nbddp"), ids=module_name)
def test_ray_is_imported_only_inside_functions_of_the_cluster_and_agent_packages(
    path: Path,
) -> None:
    ray = {n for n in imports(path) if under(n, ("ray",))}
    at_import = {n for n in imports(path, top_level_only=True) if under(n, ("ray",))}
    assert not at_import, f"{module_name(path)} imports {sorted(at_import)} at import time"
    assert not ray or under(module_name(path), ("nbddp.cluster", "nbddp.agent")), module_name(path)


@pytest.mark.parametrize("path", modules("nbddp.agent"), ids=module_name)
def test_the_agent_side_imports_nothing_of_the_notebooks_cluster_side_or_front_ends(
    path: Path,
) -> None:
    above = ("nbddp.cluster", "nbddp.notebook", "nbddp.display", "nbddp.entry", *FRONTEND)
    bad = {n for n in imports(path) if under(n, above)}
    assert not bad, f"{module_name(path)} imports {sorted(bad)}"


def _graph() -> dict[str, set[str]]:
    """Module -> the nbddp modules it imports, anywhere in it (a name taken from a
    package counts as its submodule when there is one)."""
    return {
        name: {m for m in imports(path) if m in ALL and m != name} for name, path in ALL.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            part = []
            while True:
                top = stack.pop()
                part.append(top)
                if top == node:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_no_import_cycles_even_through_imports_inside_functions() -> None:
    graph = _graph()
    # Importing a submodule loads its package's __init__ first: that is not a cycle.
    for name in graph:
        graph[name] = {m for m in graph[name] if not name.startswith(m + ".")}
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_nbddp_exposes_its_public_api_and_subpackages_only() -> None:
    extra = {
        name
        for name in dir(nbddp)
        if not name.startswith("_")
        and name not in nbddp.__all__
        and not (PACKAGE / name).is_dir()
        and not (PACKAGE / f"{name}.py").is_file()
    }
    assert not extra, f"dir(nbddp) shows names that are not its API: {sorted(extra)}"
    assert all(hasattr(nbddp, name) for name in nbddp.__all__)


def loaded(code: str, **env: str) -> dict[str, list[str]]:
    """Run ``code`` in a fresh interpreter; it ends by calling ``show()``, which prints
    the nbddp, front-end, ray and torch modules loaded, by top-level package."""
    show = textwrap.dedent(
        """
        import json, sys
        def show():
            tops = ("nbddp", "IPython", "ipykernel", "ipywidgets", "ray", "torch")
            mods = {}
            for name in sorted(sys.modules):
                if name.split(".")[0] in tops:
                    mods.setdefault(name.split(".")[0], []).append(name)
            print(json.dumps(mods))
        """
    )
    environ = {**os.environ, "NBDDP_PREWARM": "0", "PYTHONPATH": str(PACKAGE.parent), **env}
    done = subprocess.run(
        [sys.executable, "-c", show + textwrap.dedent(code)],
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    found: dict[str, list[str]] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def process_side_only(mods: dict[str, list[str]]) -> None:
    ours = mods.get("nbddp", [])
    bad = [m for m in ours if m != "nbddp" and not under(m, PROCESS_SIDE)]
    assert not bad, f"the notebook side was loaded: {bad}"
    assert not {"IPython", "ipykernel", "ipywidgets", "ray"} & set(mods), sorted(mods)


def test_the_forkserver_loads_only_what_it_runs() -> None:
    boot = loaded("import nbddp.forkserver.server\nshow()", NBDDP_ROLE="forkserver")
    assert sorted(boot["nbddp"]) == [
        "nbddp",
        "nbddp.forkserver",
        "nbddp.forkserver.keeper",
        "nbddp.forkserver.pool",
        "nbddp.forkserver.server",
        "nbddp.prctl",
    ]
    assert "torch" not in boot
    preloaded = loaded(
        "import nbddp.forkserver.server as s\ns._preload()\nshow()", NBDDP_ROLE="forkserver"
    )
    process_side_only(preloaded)
    assert "nbddp.rank.worker" in preloaded["nbddp"] and "torch" in preloaded


def test_a_spawned_keeper_loads_nothing_but_itself_before_it_forks_the_rank() -> None:
    mods = loaded("import nbddp.forkserver.keeper\nshow()", NBDDP_ROLE="worker")
    assert sorted(mods) == ["nbddp"]
    assert sorted(mods["nbddp"]) == [
        "nbddp",
        "nbddp.forkserver",
        "nbddp.forkserver.keeper",
        "nbddp.prctl",
    ]


def test_importing_nbddp_loads_only_the_package_until_a_name_is_used() -> None:
    # With NBDDP_PREWARM=0: what decides that, and nothing else.
    assert loaded("import nbddp\nshow()") == {
        "nbddp": ["nbddp", "nbddp.errors", "nbddp.launcher", "nbddp.launcher.settings"]
    }
    used = loaded("import nbddp\nnbddp.log\nshow()")
    assert "nbddp.rank.metrics" in used["nbddp"] and "torch" not in used
    assert [m for m in used["nbddp"] if m.startswith("nbddp.launcher.")] == [
        "nbddp.launcher.settings"
    ]


def test_building_a_cluster_launch_imports_no_ray_and_no_front_end() -> None:
    mods = loaded(
        "import nbddp\nnbddp.LaunchConfig.build(nodes=2, procs=1, cluster='ray://head:10001')\n"
        "show()"
    )
    assert not {"ray", "IPython", "ipykernel", "ipywidgets"} & set(mods)


def test_what_the_forkserver_runs_never_initialises_cuda() -> None:
    # A CPU machine cannot show CUDA being initialised, so every way in is made to
    # fail loudly: the preload must not reach any.
    mods = loaded(
        """
        import torch, torch.cuda

        calls = []
        def trap(*args, **kwargs):
            calls.append("cuda init")
            raise RuntimeError("CUDA initialised")
        torch.cuda._lazy_init = trap
        torch.cuda.init = trap
        torch._C._cuda_init = trap

        from nbddp.forkserver import server
        server._preload()
        assert calls == [] and not torch.cuda.is_initialized(), calls
        show()
        """,
        NBDDP_ROLE="forkserver",
    )
    assert "nbddp.rank.cell" in mods["nbddp"]
