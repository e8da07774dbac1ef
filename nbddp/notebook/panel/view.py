"""The panel's widgets: the settings form, the buttons, and what a run shows.

Contract: ``PanelView`` builds the ipywidgets tree (``root``) and nothing
else: it reads the form into ``PanelSettings`` (``settings()``), shows
per-field errors next to their fields (``show_errors``), and implements
``feed.PanelSink`` so a ``PanelFeed`` draws the ranks (a status table and
one output tab per rank), the chart and notices into it. It never launches
anything; ``panel.Panel`` wires the buttons. Every element a test or a user
may look for carries a ``nbddp-*`` CSS class, and the run and rank states
are in ``data-state`` attributes, so a browser test waits on them.

Sink methods are called from the thread pumping the run; ipywidgets sends
their changes through the kernel's thread-safe IOPub socket.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

import ipywidgets as W

from nbddp.display.style import RUN_COLORS
from nbddp.launcher.options import OPTIONS
from nbddp.notebook.panel.feed import RankView
from nbddp.notebook.panel.settings import PanelSettings

_ERROR_STYLE = "color:#d62728;font-size:12px"
_PRE = "margin:0;padding:2px 6px;white-space:pre-wrap;word-break:break-all;font-size:12px"


def _error_label(name: str) -> W.HTML:
    label = W.HTML("")
    label.add_class("nbddp-error")
    label.add_class(f"nbddp-error-{name}")
    return label


def _state_span(state: str, text: str, cls: str) -> str:
    color = RUN_COLORS.get(state, "inherit")
    return (
        f'<span class="{cls}" data-state="{html.escape(state)}" '
        f'style="font-weight:bold;color:{color}">{html.escape(text)}</span>'
    )


class PanelView:
    """The panel's widget tree (see module contract)."""

    def __init__(self, title: str, settings: PanelSettings, gpus_note: str) -> None:
        self._visible_gpus = settings.visible_gpus
        self._notice_lines: list[str] = []
        self._tab_titles: tuple[str, ...] = ()
        form = self._build_form(title, settings, gpus_note)
        self.root = W.VBox([form, *self._build_run_area()])
        self.root.add_class("nbddp-panel")
        self.show_device(settings.device)

    # -- building the tree -----------------------------------------------------

    def _build_form(self, title: str, settings: PanelSettings, gpus_note: str) -> W.VBox:
        """The title, a row per field (the field and its error), the buttons."""
        style = {"description_width": "110px"}
        layout = W.Layout(width="330px")
        self._build_device_fields(settings, style, layout)
        self._build_run_fields(settings, style, layout)
        self.fields: dict[str, W.Widget] = {
            "device": self.device,
            "gpus": self.gpus,
            "procs": self.procs,
            "nodes": self.nodes,
            "cluster": self.cluster,
            "start_method": self.start_method,
            "port": self.port,
            "mixed_precision": self.mixed_precision,
            "timeout": self.timeout,
            "max_restarts": self.max_restarts,
            "env": self.env,
        }
        self.errors = {name: _error_label(name) for name in [*self.fields, "launch"]}
        rows: dict[str, W.Widget] = {}
        for name, widget in self.fields.items():
            widget.add_class(f"nbddp-field-{name}")
            rows[name] = W.HBox([widget, self.errors[name]])
        self._gpu_row, self._procs_row = rows["gpus"], rows["procs"]
        return W.VBox(
            [
                W.HTML(f"<b>{html.escape(title)}</b> <small>{html.escape(gpus_note)}</small>"),
                *rows.values(),
                self.errors["launch"],
                self._build_buttons(),
            ]
        )

    def _build_device_fields(
        self, settings: PanelSettings, style: dict[str, str], layout: W.Layout
    ) -> None:
        """Where the ranks run: the device, the GPUs or the process count, and the nodes
        of a Ray cluster."""
        device_options = [("CPU processes", "cpu")]
        if settings.visible_gpus:
            device_options.insert(0, ("GPUs", "gpu"))
        self.device = W.ToggleButtons(
            options=device_options, value=settings.device, description="Device", style=style
        )
        self.gpus = W.SelectMultiple(
            options=[(f"GPU {i}", i) for i in range(settings.visible_gpus)],
            value=settings.gpus,
            rows=min(4, max(1, settings.visible_gpus)),
            description="GPUs",
            style=style,
            layout=layout,
        )
        self.procs = W.IntText(
            value=settings.procs, description="Processes", style=style, layout=layout
        )
        self.nodes = W.Text(
            value=settings.nodes,
            placeholder="1 (this machine)",
            description="Nodes",
            style=style,
            layout=layout,
        )
        self.cluster = W.Text(
            value=settings.cluster,
            placeholder="none, or ray://head:10001",
            description="Ray cluster",
            style=style,
            layout=layout,
        )

    def _build_run_fields(
        self, settings: PanelSettings, style: dict[str, str], layout: W.Layout
    ) -> None:
        """How the ranks are started and run: start method, port, precision, timeout,
        restarts, env."""
        self.start_method = W.Dropdown(
            options=OPTIONS["start_method"].choices,
            value=settings.start_method,
            description="Start method",
            style=style,
            layout=layout,
        )
        self.port = W.Text(
            value=settings.port,
            placeholder="auto (a free port per run)",
            description="Master port",
            style=style,
            layout=layout,
        )
        self.mixed_precision = W.Dropdown(
            options=OPTIONS["mixed_precision"].choices,
            value=settings.mixed_precision,
            description="Mixed precision",
            style=style,
            layout=layout,
        )
        self.timeout = W.Text(
            value=settings.timeout,
            placeholder="none (seconds)",
            description="Timeout (s)",
            style=style,
            layout=layout,
        )
        self.max_restarts = W.Text(
            value=settings.max_restarts,
            placeholder="none (restarts after a failure)",
            description="Max restarts",
            style=style,
            layout=layout,
        )
        self.env = W.Textarea(
            value=settings.env,
            placeholder="NAME=VALUE, one per line",
            description="Environment",
            rows=2,
            style=style,
            layout=layout,
        )

    def _build_buttons(self) -> W.HBox:
        """Launch, Stop, and the run's state beside them."""
        self.launch_button = W.Button(description="Launch", button_style="success", icon="play")
        self.launch_button.add_class("nbddp-launch")
        self.stop_button = W.Button(
            description="Stop", button_style="danger", icon="stop", disabled=True
        )
        self.stop_button.add_class("nbddp-stop")
        self.run_state = W.HTML(_state_span("idle", "idle", "nbddp-run-state"))
        return W.HBox([self.launch_button, self.stop_button, self.run_state])

    def _build_run_area(self) -> list[W.Widget]:
        """Under the form: notices, the rank table, output tabs, chart, result, the code."""
        self.ranks = W.HTML("")
        self.ranks.add_class("nbddp-ranks")
        self.tabs = W.Tab(children=[])
        self.tabs.add_class("nbddp-outputs")
        self.tabs.layout.display = "none"  # an empty box until a run has ranks
        self.chart = W.HTML("")
        self.chart.add_class("nbddp-chart")
        self.notices = W.HTML("")
        self.notices.add_class("nbddp-notices")
        self.result = W.HTML("")
        self.result.add_class("nbddp-result")
        self.code = W.HTML("")
        self.code.add_class("nbddp-code")
        code_box = W.Accordion(children=[self.code], titles=("Same run as code",))
        return [self.notices, self.ranks, self.tabs, self.chart, self.result, code_box]

    # -- the form ------------------------------------------------------------

    def settings(self) -> PanelSettings:
        """The form's current contents."""
        return PanelSettings(
            device=self.device.value,
            gpus=tuple(self.gpus.value),
            procs=int(self.procs.value),
            nodes=self.nodes.value,
            cluster=self.cluster.value,
            start_method=self.start_method.value,
            port=self.port.value,
            mixed_precision=self.mixed_precision.value,
            timeout=self.timeout.value,
            max_restarts=self.max_restarts.value,
            env=self.env.value,
            visible_gpus=self._visible_gpus,
        )

    def on_change(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` whenever any field changes."""
        for widget in self.fields.values():
            widget.observe(lambda _change: callback(), names="value")

    def show_device(self, device: str) -> None:
        """Show the GPU list or the process count, whichever the device needs."""
        self._gpu_row.layout.display = None if device == "gpu" else "none"
        self._procs_row.layout.display = None if device == "cpu" else "none"

    def show_errors(self, errors: dict[str, str]) -> None:
        """Each field's message next to it (empty where it is valid)."""
        for name, label in self.errors.items():
            message = errors.get(name, "")
            label.value = (
                f'<span style="{_ERROR_STYLE}">{html.escape(message)}</span>' if message else ""
            )

    def show_code(self, magic: str, call: str, note: str) -> None:
        """The ``%%ddp`` cell and the ``launch`` call for the current settings."""
        parts = [
            f'<pre class="nbddp-code-magic" style="{_PRE};user-select:all">'
            f"{html.escape(magic)}</pre>",
            f'<pre class="nbddp-code-launch" style="{_PRE};user-select:all">'
            f"{html.escape(call)}</pre>",
        ]
        if note:
            parts.append(f"<small>{html.escape(note)}</small>")
        self.code.value = "".join(parts)

    def set_running(self, running: bool, can_launch: bool) -> None:
        """Enable Stop while a run goes on, Launch when none does and the form is valid."""
        self.stop_button.disabled = not running
        self.launch_button.disabled = running or not can_launch

    def show_run_state(self, state: str, text: str | None = None) -> None:
        """The run's overall state beside the buttons (``data-state`` carries it)."""
        self.run_state.value = _state_span(state, text or state, "nbddp-run-state")

    def start_run(self, world_size: int) -> None:
        """Clear what the previous run showed and make a tab per rank."""
        self._notice_lines = []
        self.notices.value = ""
        self.result.value = ""
        self.chart.value = ""
        self.ranks.value = ""
        children = []
        for _ in range(world_size):
            out = W.HTML("")
            out.add_class("nbddp-rank-output")
            children.append(out)
        self.tabs.children = children
        self._tab_titles = tuple(f"rank {r}" for r in range(world_size))
        self.tabs.titles = self._tab_titles
        self.tabs.layout.display = None

    def show_result(self, text: str, detail: str = "") -> None:
        """The run's outcome: a summary line, and the failing rank's traceback if any."""
        body = f"<div>{html.escape(text)}</div>"
        if detail:
            body += f'<pre style="{_PRE};max-height:24em;overflow:auto">{html.escape(detail)}</pre>'
        self.result.value = body

    # -- feed.PanelSink --------------------------------------------------------

    def show_ranks(self, ranks: list[RankView]) -> None:
        """The status table, the tab titles and each rank's output tail."""
        rows = "".join(
            f'<tr class="nbddp-rank" data-rank="{v.rank}" data-state="{v.state}">'
            f"<td>rank {v.rank}</td><td>{_state_span(v.state, v.state, 'nbddp-rank-state')}</td>"
            f"<td>{v.elapsed}</td><td>{html.escape(v.metric)}</td></tr>"
            for v in ranks
        )
        self.ranks.value = (
            '<table style="font-family:monospace;font-size:12px;border-spacing:8px 0">'
            "<tr><th>rank</th><th>state</th><th>elapsed</th><th>last metric</th></tr>"
            f"{rows}</table>"
        )
        titles = tuple(f"rank {v.rank} · {v.state}" for v in ranks)
        if titles != self._tab_titles and len(titles) == len(self.tabs.children):
            self._tab_titles = titles
            self.tabs.titles = titles
        for view, out in zip(ranks, self.tabs.children, strict=False):
            lines = list(view.lines)
            if view.hidden:
                log = view.log.name if view.log is not None else "its log"
                lines.insert(0, f"… {view.hidden:,} earlier lines are in {log}")
            value = f'<pre style="{_PRE}">{html.escape(chr(10).join(lines))}</pre>'
            if out.value != value:
                out.value = value

    def show_chart(self, html_text: str) -> None:
        """The metric chart."""
        self.chart.value = html_text

    def show_notice(self, text: str) -> None:
        """Add a message from nbddp itself."""
        self._notice_lines.append(text)
        self.notices.value = "".join(
            f'<div style="font-size:12px">nbddp: {html.escape(line)}</div>'
            for line in self._notice_lines[-5:]
        )

    def close(self) -> None:
        """Close every widget (their views disappear from the notebook)."""
        _close_tree(self.root)


def _close_tree(widget: Any) -> None:
    for child in getattr(widget, "children", ()):
        _close_tree(child)
    widget.close()
