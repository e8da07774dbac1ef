"""How a file's path is shown in a block's HTML: plain text, or a link JupyterLab opens.

``path_html(path)`` is escaped text unless ``path`` lies under the root of the Jupyter server
that started this kernel (found once by its ``jpserver-<pid>.json``; the notebook by
``JPY_SESSION_NAME``): then a link, relative to the notebook, that opens in a tab. (A path
outside the root would open a "Start debugger?" dialog.) Anything missing means no link.
"""

from __future__ import annotations

import functools
import html
import json
import logging
import os
import urllib.parse
from pathlib import Path

log = logging.getLogger(__name__)


def path_html(path: Path | str) -> str:
    """``path`` as HTML."""
    text = html.escape(str(path))
    found = server_root()
    target = Path(os.path.abspath(path))
    if found is None or not target.is_relative_to(found[0]):
        return text
    href = urllib.parse.quote(Path(os.path.relpath(target, found[1].parent)).as_posix())
    return f'<a href="{html.escape(href)}" title="open in JupyterLab">{text}</a>'


@functools.cache
def server_root() -> tuple[Path, Path] | None:
    """(the root directory of the Jupyter server that started this kernel, the
    notebook's file), or None when either is unknown."""
    try:
        session = os.environ.get("JPY_SESSION_NAME")
        if not session:
            return None
        from jupyter_core.paths import jupyter_runtime_dir

        parent = os.getppid()
        for info_file in Path(jupyter_runtime_dir()).glob("jpserver-*.json"):
            try:
                info = json.loads(info_file.read_text())
            except (OSError, ValueError):
                continue
            if info.get("pid") == parent and info.get("root_dir"):
                root = Path(os.path.abspath(info["root_dir"]))
                notebook = Path(session)
                return root, notebook if notebook.is_absolute() else root / notebook
    except Exception:  # no jupyter_core, no runtime dir: a path shown as text loses nothing
        log.debug("nbddp: could not find the Jupyter server's root", exc_info=True)
    return None
