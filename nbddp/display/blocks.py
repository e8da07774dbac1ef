"""What the kernel display's blocks hold: a MIME bundle per rank, the footer, the start line.

Pure functions from plain values to ``{"text/plain", "text/html"}`` bundles that escape everything
a rank wrote. A finished rank's tail folds under its header unless it is short, failed, or holds a
prompt's transcript; a fold the user toggled stays so. A file's path (``path_html``) is a link
only under the root of the Jupyter server that started this kernel (outside it, JupyterLab would
offer "Start debugger?"). How states look, here and in the panel: ``STATE_COLORS``, ``RUN_COLORS``
(a state without an entry takes the default colour) and ``state_words``.
"""

from __future__ import annotations

import functools
import html
import json
import logging
import os
import urllib.parse
from pathlib import Path

from nbddp.launcher.events import RankState, RunStatus

log = logging.getLogger(__name__)

_GREEN, _RED, _DARK_RED = "#2ca02c", "#d62728", "#a50f15"
_ORANGE, _BROWN, _GREY = "#e6550d", "#8c510a", "#7f7f7f"
_BLUE = "#1f77b4"

STATE_COLORS: dict[str, str] = {
    RankState.WAITING: _BLUE,
    RankState.DONE: _GREEN,
    RankState.FAILED: _RED,
    RankState.EXITED: _DARK_RED,
    RankState.STOPPED: _ORANGE,
    RankState.INTERRUPTED: _ORANGE,
    RankState.TIMED_OUT: _BROWN,
    RankState.CANCELLED: _GREY,
}
RUN_COLORS: dict[str, str] = {
    **STATE_COLORS,
    RunStatus.TIMEOUT: _BROWN,  # (RunStatus.INTERRUPTED is RankState.INTERRUPTED's word)
}

_WORDS: dict[str, str] = {
    RankState.FAILED: "failed: {}",
    RankState.EXITED: "exited with {}",
    RankState.CANCELLED: "stopped: {}",
}


def state_words(state: str, detail: str = "") -> str:
    """``state`` as a header says it: ``failed: ValueError``, ``exited with code 3``,
    ``killed by SIGKILL``, ``stopped: rank 1 failed``; the state's name otherwise."""
    form = _WORDS.get(state)
    if form is None or not detail:
        return str(state)
    if state == RankState.EXITED and detail.startswith(("SIG", "signal")):
        return f"killed by {detail}"
    return form.format(detail)


Bundle = dict[str, str]

FOLD_LINES = 10
"""Lines a running rank shows; a finished tail this long or shorter shows open, longer folds."""
EMPTY: Bundle = {"text/plain": "", "text/html": ""}

_HEADER = "font-family:monospace;font-weight:bold;padding:1px 0"
_PRE = "margin:0 0 4px 0;padding:2px 6px;white-space:pre-wrap;word-break:break-all"
_NOTE = "font-family:monospace;font-size:85%;opacity:0.7;padding:0 6px"
_COUNT = "font-weight:normal;opacity:0.6"
_NOTICE = (
    "margin:0;padding:2px 6px;white-space:pre-wrap;word-break:break-all;"
    "background:var(--jp-rendermime-error-background,#fdd)"
)
_OPEN = frozenset((RankState.FAILED, RankState.EXITED))  # a failed rank's last words stay open
# Keeps the user's choice of open or closed across updates of the block: each
# update replaces the block's HTML, which would otherwise reset the fold.
# Only clicks count: the kernel's own choice (open, then folded) is not a choice.
_FOLD_SCRIPT = (
    "<script>(function(s){var d=s&&s.previousElementSibling;"
    "if(!d||!d.matches('details[data-fold]'))return;"
    "var m=window.nbddpFolds=window.nbddpFolds||{},k=d.getAttribute('data-fold');"
    "if(Object.prototype.hasOwnProperty.call(m,k))d.open=m[k];"
    "d.firstElementChild.addEventListener('click',function(){m[k]=!d.open;});"
    "})(document.currentScript);</script>"
)


def header_text(rank: int, words: str, elapsed: str, metric: str) -> str:
    """``rank 0 · running · 3s · step 5 loss=0.1`` (the metric only when there is one)."""
    return f"rank {rank} · {words} · {elapsed}" + (f" · {metric}" if metric else "")


def rank_bundle(
    *,
    rank: int,
    state: RankState,
    header: str,
    lines: list[str],
    hidden: int,
    log: Path | None,
    fold: str,
    asked: bool = False,
) -> Bundle:
    """One rank's block. ``hidden``: lines only in ``log``; ``fold``: the id that names the
    fold in the page (stable for the block's life); ``asked``: it has asked for input."""
    plain = [header]
    if hidden:
        plain.append(f"… {hidden:,} earlier lines in {log if log is not None else 'its log'}")
    plain += lines
    if not state.ended and not asked:  # in view, a running rank's last lines, not a page of them
        hidden, lines = hidden + max(0, len(lines) - FOLD_LINES), lines[-FOLD_LINES:]
    attrs = f'class="nbddp-rank" data-rank="{rank}" data-state="{html.escape(state)}"'
    style = _style(state)
    total = hidden + len(lines)
    where_html = path_html(log) if log is not None else "its log"
    # A failed rank's block names its log (its error cannot: ``errors.ShownLines``).
    note = f"last {len(lines):,} of {total:,} lines; all in " if hidden else "full output in "
    note = f'<div class="nbddp-note" style="{_NOTE}">{note}{where_html}</div>'
    note = note if hidden or state in _OPEN else ""
    if not lines:
        shown = f'<div {attrs}><div style="{style}">{html.escape(header)}</div>{note}</div>'
        return {"text/plain": "\n".join(plain), "text/html": shown}
    is_open = not state.ended or state in _OPEN or asked or len(lines) <= FOLD_LINES
    # The folded header says how much is inside (the plain text's header stays as is).
    count = f'<span style="{_COUNT}"> ({total:,} line{"s" if total != 1 else ""})</span>'
    body = html.escape("\n".join(lines))
    shown = (
        f'<details {attrs} data-fold="{html.escape(fold)}"{" open" if is_open else ""}>'
        f'<summary style="{style};cursor:pointer">{html.escape(header)}{count}</summary>'
        f'{note}<pre style="{_PRE}">{body}</pre></details>{_FOLD_SCRIPT}'
    )
    return {"text/plain": "\n".join(plain), "text/html": shown}


def headers_only_bundle(
    *, rank: int, state: RankState, header: str, note: str, log: Path | None
) -> Bundle:
    """A rank's block once the display has failed: its header and ``note`` (what
    happened, where its output is now), and its log."""
    where = str(log) if log is not None else "its log"
    where_html = path_html(log) if log is not None else "its log"
    shown = (
        f'<div class="nbddp-rank" data-rank="{rank}" data-state="{html.escape(state)}">'
        f'<div style="{_style(state)}">{html.escape(header)}</div>'
        f'<div class="nbddp-note" style="{_NOTE}">{html.escape(note)}; all its output is in '
        f"{where_html}</div></div>"
    )
    return {"text/plain": f"{header}\n({note}; all its output is in {where})", "text/html": shown}


def _style(state: str) -> str:
    color = STATE_COLORS.get(state)
    return _HEADER + (f";color:{color}" if color else "")


def footer_bundle(notices: list[str], chart_plain: str, chart_html: str) -> Bundle:
    """nbddp's notices (as stderr shows them) over the metrics chart; either may be empty."""
    plain = [f"nbddp: {text}" for text in notices]
    shown = "".join(
        f'<pre class="nbddp-notice" style="{_NOTICE}">nbddp: {html.escape(text)}</pre>'
        for text in notices
    )
    if chart_plain or chart_html:
        plain.append(chart_plain)
        shown += chart_html
    return {"text/plain": "\n".join(plain), "text/html": shown}


def starting_bundle(world_size: int) -> Bundle:
    """The line shown from the moment a launch begins until the ranks' blocks replace it."""
    text = f"starting {world_size} rank{'s' if world_size != 1 else ''}…"
    shown = f'<div class="nbddp-starting" style="{_HEADER};opacity:0.6">{html.escape(text)}</div>'
    return {"text/plain": text, "text/html": shown}


def path_html(path: Path | str) -> str:
    """``path`` as HTML: escaped text, or under the server's root a link relative to the
    notebook (``server_root``, found once from its ``jpserver-<pid>.json``)."""
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
