"""The docs cover what the code has, and the README's links lead somewhere.

The site itself is built by ``mkdocs build --strict`` in the test command
(.ci/run), which fails on a broken link, a missing anchor or a reference
that does not resolve. These checks hold the pages to the code: every public
name has its reference entry, every magic its help, every error class its
troubleshooting section, and every recorded bench its plot.
"""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path

import pytest

import nbddp
from nbddp import errors

ROOT = Path(nbddp.__file__).parent.parent
DOCS = ROOT / "docs"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)$")


def pins(path: Path) -> dict[str, str]:
    found = {}
    for line in path.read_text().splitlines():
        if m := PIN.match(line.split("#")[0].strip()):
            found[m.group(1).lower()] = m.group(2)
    return found


def test_the_docs_requirements_are_pinned_as_ci_pins_them() -> None:
    docs = pins(DOCS / "requirements.txt")
    ci = pins(ROOT / ".ci" / "requirements.txt")
    assert {"mkdocs", "mkdocs-material", "mkdocstrings-python"} <= set(docs)
    differ = {name: (v, ci.get(name)) for name, v in docs.items() if ci.get(name) != v}
    assert not differ, f"docs/requirements.txt and .ci/requirements.txt differ: {differ}"


def test_the_api_reference_has_every_public_name() -> None:
    page = (DOCS / "reference" / "api.md").read_text()
    shown = set(re.findall(r"^::: nbddp\.(\w+)$", page, re.M))
    assert set(nbddp.__all__) - shown == set(), "add them to docs/reference/api.md"


def test_the_magics_page_has_every_magic() -> None:
    from nbddp.notebook.magics import DdpMagics

    page = (DOCS / "reference" / "magics.md").read_text()
    shown = set(re.findall(r"<!-- nbddp:magic ([a-z_ ]+?) -->", page))
    registered = set(DdpMagics.magics["line"]) | set(DdpMagics.magics["cell"])
    assert registered - shown == set(), "add them to docs/reference/magics.md"


def test_troubleshooting_has_a_section_for_every_error_class() -> None:
    page = (DOCS / "troubleshooting.md").read_text()
    anchors = set(re.findall(r"\{#([a-z0-9-]+)\}", page))
    classes = {
        cls.__name__
        for cls in vars(errors).values()
        if inspect.isclass(cls)
        and issubclass(cls, BaseException)
        and cls.__module__ == errors.__name__
    }
    missing = {name for name in classes if name.lower() not in anchors}
    assert not missing, f"docs/troubleshooting.md has no section {{#name}} for {sorted(missing)}"


def test_the_readme_links_to_files_that_exist() -> None:
    text = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    local = [t for t in targets if "://" not in t]
    assert local, "the README links to its docs pages"
    missing = [t for t in local if not (ROOT / t).exists()]
    assert not missing, f"README links to missing files: {missing}"


def test_every_recorded_bench_has_its_plot() -> None:
    recorded = sorted((DOCS / "bench").glob("*.json"))
    assert recorded, "docs/bench holds the benches' figures"
    for path in recorded:
        data = json.loads(path.read_text())
        assert data["bench"] == path.stem and data["machine"] and data["date"], path
        assert (DOCS / "assets" / "bench" / f"{path.stem}.png").exists(), path


def test_plot_draws_every_recorded_bench(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")  # .ci/requirements.txt installs it
    import importlib.util

    spec = importlib.util.spec_from_file_location("plot", ROOT / "tests" / "bench" / "plot.py")
    assert spec and spec.loader
    plot = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plot)
    for path in sorted((DOCS / "bench").glob("*.json")):
        png = plot.plot(path, tmp_path)
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png


def test_every_figure_a_page_quotes_is_in_the_recorded_benches() -> None:
    pytest.importorskip("mkdocs")  # docs/hooks.py is MkDocs' (.ci/requirements.txt installs it)
    import importlib.util

    spec = importlib.util.spec_from_file_location("hooks", DOCS / "hooks.py")
    assert spec and spec.loader
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    specs = [
        (page.name, m.group(1))
        for page in sorted(DOCS.glob("**/*.md"))
        for m in hooks.FIGURE.finditer(page.read_text())
    ]
    assert specs, "the pages take their figures from docs/bench/*.json"
    for page, spec_text in specs:
        assert re.fullmatch(r"[\d.]+ (ms|s)|[\d.]+x|[\d.]+", hooks.figure(spec_text)), page


def test_the_readme_quotes_no_timing_of_its_own() -> None:
    """The README is not built by MkDocs: its timings would be hand-written, so it has
    none and links to the Benchmarks page, whose figures come from the benches' JSON."""
    text = (ROOT / "README.md").read_text()
    assert not re.findall(r"\b\d+(?:\.\d+)? ?(?:ms|s)\b", text)
    assert "docs/benchmarks.md" in text


def test_the_install_lines_name_extras_pyproject_has() -> None:
    """``pip install -e ".[notebook,demo]"`` installs what the pages then run: each extra
    exists, and the quickstart's scikit-learn comes with ``demo``."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    pages = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
    named = [
        (page.name, m.group(1))
        for page in pages
        for m in re.finditer(r'pip install -e "\.\[([a-z,]+)\]"', page.read_text())
    ]
    assert named, "the pages say how to install from a clone"
    for page, names in named:
        assert set(names.split(",")) <= set(extras), (page, names)
        assert "demo" in names.split(","), f"{page}: the quickstart needs scikit-learn ([demo])"
    assert any(req.startswith("scikit-learn") for req in extras["demo"])
