"""The README's first command installs what ``python -m nbddp.demo`` needs, pinned as CI pins it.

``pip install -r .ci/demo-requirements.txt -e '.[demo]'``: the ``demo`` extra
names every distribution ``nbddp/demo.py`` imports beyond the core, and
``.ci/demo-requirements.txt`` pins the core and the extra at the versions
``.ci/requirements.txt`` (the full development set) pins.
"""

from __future__ import annotations

import ast
import re
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

import tomllib

import nbddp

ROOT = Path(nbddp.__file__).parent.parent
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def normalise(name: str) -> str:
    """A distribution name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_names(specs: list[str]) -> set[str]:
    return {normalise(m.group()) for spec in specs if (m := NAME.match(spec))}


def pins(path: Path) -> dict[str, str]:
    """``name: version`` for every ``name==version`` line; any other requirement fails."""
    found: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep and NAME.fullmatch(name.strip()), f"{path.name}: {line!r} is not a pin"
            found[normalise(name.strip())] = version.strip()
    return found


def project() -> dict[str, list[str]]:
    """The core dependencies (key ``""``) and each extra's, from pyproject.toml."""
    table = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {"": table["dependencies"], **table["optional-dependencies"]}


def demo_distributions() -> set[str]:
    """The distributions providing the top-level modules ``nbddp/demo.py`` imports."""
    tree = ast.parse((ROOT / "nbddp" / "demo.py").read_text())
    modules = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    modules |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    tops = {m.split(".")[0] for m in modules} - set(sys.stdlib_module_names) - {"__future__"}
    provided = packages_distributions()
    return {normalise(d) for top in tops - {"nbddp"} for d in provided[top]}


def test_the_demo_extra_names_what_the_demo_imports_beyond_the_core() -> None:
    deps = project()
    assert "scikit-learn" in demo_distributions()  # the check sees the import inside load_data
    missing = demo_distributions() - requirement_names(deps[""]) - requirement_names(deps["demo"])
    assert not missing, f"nbddp/demo.py imports {sorted(missing)}: add them to the demo extra"


def test_demo_requirements_pin_the_core_and_the_demo_extra_as_ci_does() -> None:
    demo = pins(ROOT / ".ci" / "demo-requirements.txt")
    full = pins(ROOT / ".ci" / "requirements.txt")
    deps = project()
    unpinned = (requirement_names(deps[""]) | requirement_names(deps["demo"])) - set(demo)
    assert not unpinned, f"not pinned in demo-requirements.txt: {sorted(unpinned)}"
    differ = {name: (v, full.get(name)) for name, v in demo.items() if full.get(name) != v}
    assert not differ, f"demo-requirements.txt and requirements.txt pin differently: {differ}"
    assert demo["torch"] == "2.13.0"  # the CPU build on disk: any other can pull CUDA wheels


def test_the_user_extras_install_what_notebooks_use() -> None:
    deps = project()
    # tqdm bars in every example; pandas for ``run.metrics.to_pandas()``.
    assert {"ipython", "ipykernel", "tqdm", "pandas"} <= requirement_names(deps["notebook"])
    assert {"nbddp", "ipywidgets"} <= requirement_names(deps["panel"])
    assert "nbddp[notebook]" in deps["panel"]
    assert "ray" in requirement_names(deps["ray"])


def test_the_readme_opens_with_the_user_install_then_the_clone_commands() -> None:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    assert len(blocks[0].splitlines()) == 1, blocks[0]
    assert blocks[0].startswith('pip install -e ".[notebook,demo]"'), blocks[0]
    commands = [line for line in blocks[1].splitlines() if not line.startswith("#")]
    assert commands[0].endswith("python -m nbddp.demo")
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert commands[1] in ci, "the README's test command is what .ci/run runs"
