"""MkDocs hooks: what the pages show that comes from the code or from the benches.

One source of truth: nothing here is copied by hand into a page.

- ``<!-- nbddp:magic NAME -->`` becomes the help of the magic ``NAME`` (``ddp``,
  ``ddp_config``, ``ddp_session``, ``ddp_session start``, ``ddp_status``,
  ``ddp_debug``, ``ddp_panel``) as ``%%ddp?`` shows it: the argparse help that
  IPython's ``magic_arguments`` builds from ``nbddp/notebook/magics.py``, or the
  magic's docstring for those that parse their line themselves.
- ``<!-- nbddp:settings -->`` becomes the table of ``NBDDP_*`` variables, read
  from ``nbddp/launcher/settings.py`` (name, default, what a value must be, and
  the docstring under each).
- ``<!-- nbddp:bench NAME -->`` becomes the plot ``assets/bench/NAME.png``
  (``tests/bench/plot.py``) of ``docs/bench/NAME.json`` (``tests/bench/NAME.py
  --json``), the machine and date it was measured on, and the run's tables,
  folded. A marker without its JSON, or a JSON without its PNG, fails the
  strict build.
- ``<!-- nbddp:figure BENCH TABLE "ROW" "COLUMN" -->`` becomes one figure of
  ``docs/bench/BENCH.json``: the value in the row ``ROW`` (its first cell, or its
  first two joined by `` / ``) and the column ``COLUMN`` of the table ``TABLE``,
  written with the column's unit (``12 ms``, ``0.06 s``, ``1.3x``). After them,
  ``minus "ROW" "COLUMN"`` or ``over "ROW" "COLUMN"`` gives the difference or the
  ratio of two figures of that table. A figure the JSON does not have fails the
  strict build: the pages quote no figure by hand.
- ``notebooks/*.ipynb`` are added to the site as ``examples/NAME.ipynb`` (to
  download) and rendered as the pages ``examples/NAME.md``: markdown cells as
  they are, code cells as code (the notebooks are stored without outputs).

The docs describe this checkout: its nbddp is imported (installed or not), and
importing it here must not start its forkserver: ``NBDDP_PREWARM=0``.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import os
import re
import shlex
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

log = logging.getLogger("mkdocs.hooks.nbddp")

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
HELP_COLUMNS = "76"  # fits a code block of the theme without scrolling
MAGIC = re.compile(r"<!-- nbddp:magic ([a-z_ ]+?) -->")
SETTINGS = "<!-- nbddp:settings -->"
BENCH = re.compile(r"<!-- nbddp:bench (\w+) -->")
FIGURE = re.compile(r"<!-- nbddp:figure (.+?) -->")


def on_config(config: Any) -> Any:
    os.environ["NBDDP_PREWARM"] = "0"  # importing nbddp starts no forkserver here
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))  # this checkout's nbddp, installed or not
    return config


def on_files(files: Files, config: Any) -> Files:
    """The example notebooks, as ``examples/NAME.ipynb`` and as pages ``examples/NAME.md``."""
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        files.append(
            File.generated(config, f"examples/{notebook.name}", abs_src_path=str(notebook))
        )
        page = notebook_page(notebook)
        files.append(File.generated(config, f"examples/{notebook.stem}.md", content=page))
    return files


def notebook_page(path: Path) -> str:
    """A notebook as a page: its markdown cells, its code cells as code blocks."""
    cells = json.loads(path.read_text())["cells"]
    parts = []
    for n, cell in enumerate(cells):
        source = "".join(cell["source"]).rstrip()
        if not source:
            continue
        if cell["cell_type"] == "markdown":
            parts.append(source)
        elif cell["cell_type"] == "code":
            parts.append(f"```python\n{source}\n```")
        if n == 0:
            parts.append(
                f"`notebooks/{path.name}` in the repository "
                f"([download]({path.name})); the tests run it in a real kernel."
            )
    return "\n\n".join(parts) + "\n"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    markdown = MAGIC.sub(lambda m: magic_help(m.group(1)), markdown)
    if SETTINGS in markdown:
        markdown = markdown.replace(SETTINGS, settings_table())
    markdown = FIGURE.sub(lambda m: figure_text(m.group(1)), markdown)
    return BENCH.sub(lambda m: bench(m.group(1), page.file.src_uri), markdown)


# -- magics ------------------------------------------------------------------------------


@contextlib.contextmanager
def columns(width: str) -> Iterator[None]:
    """argparse wraps help to ``$COLUMNS``: a fixed width, whatever the terminal."""
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = width
    try:
        yield
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before


def magic_help(name: str) -> str:
    """The help ``%NAME?`` shows, as a code block."""
    from nbddp.notebook.magics import DdpMagics

    attribute = "_session_start" if name == "ddp_session start" else name
    method: Callable[..., Any] | None = getattr(DdpMagics, attribute, None)
    if method is None:
        raise ValueError(f"docs: no magic {name!r} in nbddp/notebook/magics.py")
    parser = getattr(method, "parser", None)
    if parser is not None:
        with columns(HELP_COLUMNS):
            text = parser.format_help()
        # IPython's help starts with a reStructuredText "::" and indents the usage under it.
        text = text.removeprefix("::\n\n  ")
    else:
        usage = f"%{name}"
        text = f"{usage}\n\n{inspect.cleandoc(method.__doc__ or '')}\n"
    return f"```text\n{text.rstrip()}\n```"


# -- settings ----------------------------------------------------------------------------


def settings_table() -> str:
    """The ``NBDDP_*`` variables: name, default, what a value must be, what it does."""
    import griffe

    from nbddp.launcher import settings

    module = griffe.load("nbddp.launcher.settings", search_paths=[str(ROOT)])
    rows = ["| variable | default | a value must be | what it does |", "|---|---|---|---|"]
    for name, member in module.members.items():
        value = getattr(settings, name, None)
        if not isinstance(value, settings.Setting):
            continue
        doc = " ".join((member.docstring.value if member.docstring else "").split())
        default = "unset" if value.default is None else f"`{shown(value.default)}`"
        rows.append(f"| `{value.name}` | {default} | {value.must_be} | {doc} |")
    return "\n".join(rows)


def shown(default: object) -> str:
    """A default as one would set it: ``1`` for True, ``8`` for 8.0."""
    if isinstance(default, bool):
        return str(int(default))
    return f"{default:g}" if isinstance(default, float) else str(default)


# -- benches -----------------------------------------------------------------------------


def bench(name: str, src_uri: str) -> str:
    """The plot, the machine and the folded tables of ``docs/bench/NAME.json``."""
    path = DOCS / "bench" / f"{name}.json"
    if not path.exists():
        log.warning(f"docs/bench/{name}.json is missing: run tests/bench/{name}.py --json")
        return f"(no figures recorded for {name})"
    data = json.loads(path.read_text())
    png = DOCS / "assets" / "bench" / f"{name}.png"
    if not png.exists():
        log.warning(f"{path} has no plot: run tests/bench/plot.py {path.relative_to(ROOT)}")
    up = "../" * src_uri.count("/")
    machine = data.get("machine", {})
    gpus = ", ".join(machine.get("gpus") or []) or "no GPU"
    parts = [
        f"![{name} bench]({up}assets/bench/{name}.png)",
        "",
        f"Measured {str(data.get('date', '?'))[:10]} with `{data.get('command', '?')}` on "
        f"{machine.get('cpu', '?')}, {machine.get('cores', '?')} cores, "
        f"{machine.get('memory_gib', '?')} GiB, {gpus}, Python {machine.get('python', '?')}, "
        f"torch {machine.get('torch', '?')} (load average at the end "
        f"{', '.join(map(str, machine.get('load_average', [])))}); "
        f"[the figures as JSON]({up}bench/{name}.json).",
        "",
    ]
    for table in data.get("tables", []):
        parts.append(f'??? note "{table.get("title") or table.get("name")}"')
        parts.extend("    " + line for line in markdown_table(table).splitlines())
        parts.append("")
    notes = data.get("notes", [])
    if notes:
        parts.append('??? note "What the script noted during the run"')
        parts.extend(f"    - {note}" for note in notes)
        parts.append("")
    return "\n".join(parts) + "\n"


def markdown_table(table: dict[str, Any]) -> str:
    cols = table["columns"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in table["rows"]:
        lines.append("| " + " | ".join(cell(c) for c in row) + " |")
    return "\n".join(lines)


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, list):
        shown = ", ".join(cell(v) for v in value[:12])
        return shown + (f", ... ({len(value)} in all)" if len(value) > 12 else "")
    return str(value).replace("|", "\\|")


# -- figures -----------------------------------------------------------------------------


def figure_text(spec: str) -> str:
    """``BENCH TABLE "ROW" "COLUMN" [minus|over "ROW" "COLUMN"]``, written out; a figure
    that is not there is a warning (an error in the strict build) and shows as such."""
    try:
        return figure(spec)
    except (KeyError, ValueError, OSError) as exc:
        log.warning(f"nbddp:figure {spec}: {exc}")
        return f"(no figure: {spec})"


def figure(spec: str) -> str:
    """The figure ``spec`` names (``figure_text``), raising when it is not recorded."""
    words = shlex.split(spec)
    if len(words) not in (4, 7):
        raise ValueError('write BENCH TABLE "ROW" "COLUMN" [minus|over "ROW" "COLUMN"]')
    name, table_name, row, column = words[:4]
    data = json.loads((DOCS / "bench" / f"{name}.json").read_text())
    tables = [t for t in data.get("tables", []) if t.get("name") == table_name]
    if not tables:
        raise KeyError(f"docs/bench/{name}.json has no table {table_name!r}")
    table = tables[0]
    value = table_value(table, row, column)
    if len(words) == 7:
        op, other = words[4], table_value(table, words[5], words[6])
        if op not in ("minus", "over"):
            raise ValueError(f"{op!r}: write minus or over")
        if op == "over":
            return f"{value / other:.2g}x"
        value -= other
    return with_unit(value, column)


def table_value(table: dict[str, Any], row: str, column: str) -> float:
    """The number in ``table`` at ``row`` (first cell, or first two joined by " / ") and
    ``column``."""
    if column not in table["columns"]:
        raise KeyError(f"table {table['name']!r} has no column {column!r}")
    at = table["columns"].index(column)
    for cells in table["rows"]:
        if row in (str(cells[0]), " / ".join(map(str, cells[:2]))):
            if not isinstance(cells[at], (int, float)):
                raise ValueError(f"{row!r} / {column!r} is {cells[at]!r}, not a number")
            return float(cells[at])
    raise KeyError(f"table {table['name']!r} has no row {row!r}")


def with_unit(value: float, column: str) -> str:
    """``value`` as the column's unit writes it: ms whole, s to two significant digits."""
    unit = re.search(r"\((ms|s)\)", column)
    if unit is None:
        return f"{value:.2g}x" if "/" in column or "ratio" in column else f"{value:.3g}"
    if unit.group(1) == "ms":
        return f"{value:.0f} ms"
    return f"{value:.2g} s"
