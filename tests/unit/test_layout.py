"""The layout's rules: a module's place says which process runs it, and imports respect that.

- ``nbddp.rank`` and ``nbddp.wire`` run in ranks (and ``wire`` in the forkserver too):
  they import nothing of the notebook side (``launcher``, ``notebook``, ``display``)
  and never IPython, ipykernel or ipywidgets, not even inside a function.
- The notebook side imports IPython and ipywidgets only inside functions
  (importing nbddp must not import them: every rank imports nbddp).
- The forkserver (``launcher.forkserver``, ``launcher.pool``) imports only the
  rank and wire sides and what starts a rank; what it runs never initialises CUDA.
- ``nbddp`` itself exposes its public API and its subpackages, nothing else.
- Ray is optional: only ``nbddp.cluster`` imports it, only inside functions (a
  cluster run), and nothing else imports the modules of ``nbddp.cluster`` that
  need it, except inside functions; ``import nbddp`` never imports ray.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import nbddp

PACKAGE = Path(nbddp.__file__).parent
FRONTEND = ("IPython", "ipykernel", "ipywidgets")
NOTEBOOK_SIDE = ("nbddp.launcher", "nbddp.notebook", "nbddp.display", "nbddp.cluster")
FORKSERVER_MAY_IMPORT = (
    "nbddp.rank",
    "nbddp.wire",
    "nbddp.errors",
    "nbddp.launcher.starters",
    "nbddp.launcher.pool",
    "nbddp.launcher.hugepages",
    "nbddp.launcher.forkserver",
)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, *, top_level_only: bool = False) -> set[str]:
    """Every module ``path`` imports (relative imports resolved)."""
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


def under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def modules(*subpackages: str) -> list[Path]:
    return sorted(p for sub in subpackages for p in (PACKAGE / sub).rglob("*.py"))


@pytest.mark.parametrize("path", modules("rank", "wire"), ids=module_name)
def test_rank_and_wire_modules_import_nothing_of_the_notebook_side(path: Path) -> None:
    bad = {n for n in imports(path) if under(n, NOTEBOOK_SIDE + FRONTEND)}
    assert not bad, f"{module_name(path)} imports {sorted(bad)}"


def test_the_cell_program_imports_no_frontend() -> None:
    # Ranks unpickle and run it.
    path = PACKAGE / "notebook" / "cell.py"
    bad = {n for n in imports(path) if under(n, FRONTEND + NOTEBOOK_SIDE)}
    assert not bad, f"notebook.cell imports {sorted(bad)}"


# The magics and the panel are the frontends' own modules, imported only when used.
NOT_FRONTEND = [
    p
    for p in [*modules("launcher", "display", "notebook"), PACKAGE / "__init__.py"]
    if p.parent.name != "panel" and p.name != "magics.py"
]


@pytest.mark.parametrize("path", NOT_FRONTEND, ids=module_name)
def test_frontends_are_imported_only_inside_functions(path: Path) -> None:
    bad = {n for n in imports(path, top_level_only=True) if under(n, FRONTEND)}
    assert not bad, f"{module_name(path)} imports {sorted(bad)} at import time"


@pytest.mark.parametrize("name", ["forkserver.py", "pool.py", "hugepages.py"])
def test_the_forkserver_imports_only_the_rank_and_wire_sides(name: str) -> None:
    path = PACKAGE / "launcher" / name
    ours = {n for n in imports(path) if n == "nbddp" or n.startswith("nbddp.")}
    bad = {n for n in ours if not under(n, FORKSERVER_MAY_IMPORT)}
    assert not bad, f"launcher/{name} imports {sorted(bad)}"


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


def run_python(code: str) -> str:
    env = {**os.environ, "NBDDP_PREWARM": "0", "PYTHONPATH": str(PACKAGE.parent)}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_importing_nbddp_imports_no_frontend() -> None:
    out = run_python(
        """
        import sys
        import nbddp
        frontends = ("IPython", "ipykernel", "ipywidgets")
        print(sorted(m for m in sys.modules if m.split(".")[0] in frontends))
        """
    )
    assert out.strip() == "[]"


def test_what_the_forkserver_runs_never_initialises_cuda() -> None:
    # A CPU machine cannot show CUDA being initialised, so every way in is made to
    # fail loudly: the preload and a pool worker's warm-up must not reach any.
    out = run_python(
        """
        import torch, torch.cuda

        calls = []
        def trap(*args, **kwargs):
            calls.append("cuda init")
            raise RuntimeError("CUDA initialised")
        torch.cuda._lazy_init = trap
        torch.cuda.init = trap
        torch._C._cuda_init = trap

        from nbddp.launcher import forkserver
        from nbddp.rank import pooled
        forkserver._preload()
        pooled._warm_up()
        print(calls)
        """
    )
    assert out.strip() == "[]"


CLUSTER_NO_RAY = ("nbddp.cluster", "nbddp.cluster.spec")
"""What the rest of nbddp may import of ``nbddp.cluster`` at import time: nothing of ray."""


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=module_name)
def test_ray_is_imported_only_inside_functions(path: Path) -> None:
    bad = {n for n in imports(path, top_level_only=True) if under(n, ("ray",))}
    assert not bad, f"{module_name(path)} imports {sorted(bad)} at import time"


@pytest.mark.parametrize(
    "path",
    [p for p in sorted(PACKAGE.rglob("*.py")) if p.parent.name != "cluster"],
    ids=module_name,
)
def test_outside_cluster_only_its_ray_free_modules_are_imported_at_import_time(
    path: Path,
) -> None:
    found = {n for n in imports(path, top_level_only=True) if under(n, ("nbddp.cluster",))}
    bad = {
        n for n in found if n not in CLUSTER_NO_RAY and n.rpartition(".")[0] not in CLUSTER_NO_RAY
    }
    assert not bad, f"{module_name(path)} imports {sorted(bad)} at import time"


def test_importing_nbddp_and_building_a_cluster_launch_imports_no_ray() -> None:
    out = run_python(
        """
        import sys
        import nbddp
        nbddp.LaunchConfig.build(nodes=2, procs=1, cluster="ray://head:10001")
        print(sorted(m for m in sys.modules if m.split(".")[0] == "ray"))
        """
    )
    assert out.strip() == "[]"
