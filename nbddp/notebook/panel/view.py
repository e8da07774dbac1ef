"""The panel's widgets: the settings form, the buttons, and what a run shows.

``PanelView`` builds the ipywidgets tree (``root``) and nothing else: it reads the form
(``settings()``), shows each field's error (``show_errors``), and is the ``feed.PanelSink`` a
``PanelFeed`` draws ranks, chart and notices into; ``panel.Panel`` wires the buttons. Elements
carry ``nbddp-*`` classes and states ``data-state`` attributes, for users and browser tests. Sink
methods run on the run's pumping thread (ipywidgets sends through the thread-safe IOPub socket).
"""

from __future__ import annotations

import html
from collections.abc import Callable

import ipywidgets as W

from nbddp.display.blocks import RUN_COLORS
from nbddp.launcher.options import OPTIONS
from nbddp.launcher.spelling import PANEL
from nbddp.notebook.panel.feed import RankView
from nbddp.notebook.panel.settings import FIELDS, PanelSettings

_ERROR_STYLE = "color:#d62728;font-size:12px"
_PRE = "margin:0;padding:2px 6px;white-space:pre-wrap;word-break:break-all;font-size:12px"
_NOTE = "color:var(--jp-ui-font-color2,#616161);font-size:12px"
# The panel's own rules, scoped to it: a wrong field's box turns red (the message
# beside it says why), and the chosen device reads as chosen, the other as a choice.
_CSS = """<style>
.nbddp-panel .nbddp-invalid input, .nbddp-panel .nbddp-invalid textarea {
  border-color: #d62728 !important;
  box-shadow: inset 0 0 0 1px #d62728;
  background-color: rgba(214, 39, 40, 0.06);
}
.nbddp-panel .nbddp-field-device .widget-toggle-button.mod-active {
  background-color: var(--jp-brand-color1, #1976d2);
  color: #fff;
}
.nbddp-panel .nbddp-field-device { display: flex; align-items: center; flex-shrink: 0; }
.nbddp-panel .nbddp-field-device > div { display: flex; flex-wrap: nowrap; }
.nbddp-panel .nbddp-field-device > .widget-label { text-align: right; flex-shrink: 0; }
.nbddp-panel .nbddp-error span { white-space: normal; }
</style>"""


_STYLE = {"description_width": "110px"}
_PROMPT = "the rank's input, then Send"
# The text fields, and what each takes. Text, not IntText, for numbers too: a number input drops
# letters without a word; here they stay visible and the field's error says what it takes.
_PLACEHOLDERS = {
    "procs": "e.g. 2",
    "nodes": "1 (this machine)",
    "cluster": "none, or ray://head:10001",
    "port": "auto (a free port per run)",
    "timeout": "none (seconds)",
    "max_restarts": "none (restarts after a failure)",
    "env": "NAME=VALUE, one per line",
}


def _html(cls: str, value: str = "", **kwargs: W.Layout) -> W.HTML:
    return W.HTML(value, **kwargs).add_class(cls)


def _note(text: str, style: str = "") -> str:
    return f'<div style="{_NOTE}{style}">{html.escape(text)}</div>'


def _field(name: str, settings: PanelSettings) -> W.Widget:
    """The launch field ``name`` (after the device's), labelled as ``spelling.PANEL`` says."""
    common = {
        "value": getattr(settings, name),
        "description": PANEL.names[name],
        "style": _STYLE,
        "layout": W.Layout(width="330px"),
    }
    if name == "env":
        return W.Textarea(placeholder=_PLACEHOLDERS[name], rows=2, **common)
    if name in _PLACEHOLDERS:
        return W.Text(placeholder=_PLACEHOLDERS[name], **common)
    return W.Dropdown(options=OPTIONS[name].choices, **common)


def _state_span(state: str, text: str, cls: str) -> str:
    color = RUN_COLORS.get(state, "inherit")
    return (
        f'<span class="{cls}" data-state="{html.escape(state)}" '
        f'style="font-weight:bold;color:{color}">{html.escape(text)}</span>'
    )


class PanelView:
    def __init__(
        self,
        title: str,
        settings: PanelSettings,
        gpus_note: str,
        kwargs_hint: str = "e.g. epochs=3, lr=0.1",
    ) -> None:
        self._visible_gpus = settings.visible_gpus
        self._notice_lines: list[str] = []
        form = self._build_form(title, settings, gpus_note, kwargs_hint)
        self.root = W.VBox([W.HTML(_CSS), form, *self._build_run_area()]).add_class("nbddp-panel")
        self.show_device(settings.device)

    # -- building the tree -----------------------------------------------------

    def _build_form(
        self, title: str, settings: PanelSettings, gpus_note: str, kwargs_hint: str
    ) -> W.VBox:
        """The title, a row per field (the field and its error), the buttons."""
        self.kwargs = W.Text(
            value=settings.kwargs,
            placeholder=kwargs_hint,
            description="Keyword args",
            tooltip="The function's keyword arguments, as Python literals",
            style=_STYLE,
            layout=W.Layout(width="460px"),
        )
        self._build_device_fields(settings, gpus_note)
        others = {name: _field(name, settings) for name in FIELDS[2:]}
        self.fields: dict[str, W.Widget] = {"device": self.device, "gpus": self.gpus, **others}
        vars(self).update(others)  # each also as the view's attribute of its name: view.procs
        self.inputs: dict[str, W.Widget] = {"kwargs": self.kwargs, **self.fields}
        """Every field of the form (``settings.FORM``): the keyword arguments, then ``fields``."""
        self.errors: dict[str, W.HTML] = {}
        for name in [*self.inputs, "launch"]:
            label = _html("nbddp-error", layout=W.Layout(max_width="600px"))
            self.errors[name] = label.add_class(f"nbddp-error-{name}")
        rows: dict[str, W.Widget] = {}
        for name, widget in self.inputs.items():
            widget.add_class(f"nbddp-field-{name}")
            note = [self.gpus_note] if name == "device" else []
            rows[name] = W.HBox([widget, *note, self.errors[name]])
        self._gpu_row, self._procs_row = rows["gpus"], rows["procs"]
        self.title = _html("nbddp-title")
        self.show_title(title)
        return W.VBox([self.title, *rows.values(), self.errors["launch"], self._build_buttons()])

    def _build_device_fields(self, settings: PanelSettings, gpus_note: str) -> None:
        """Where the ranks run: the device, and the GPUs (the note beside it says which)."""
        # Both choices always: a lone toggle reads as disabled. Without a GPU, choosing
        # GPUs says why it cannot be (the device's error), and the note says it anyway.
        gpu_tip = (
            "A process per chosen GPU (nccl)"
            if settings.visible_gpus
            else "No GPU found: runs use CPU processes"
        )
        self.device = W.ToggleButtons(
            options=[("GPUs", "gpu"), ("CPU processes", "cpu")],
            value=settings.device,
            description="Devices",
            tooltips=[gpu_tip, "CPU processes (gloo); GPUs are hidden from them"],
            style={**_STYLE, "button_width": "120px"},
            layout=W.Layout(width="auto"),
        )
        note = f'<span style="{_NOTE}">{html.escape(gpus_note)}</span>'
        self.gpus_note = _html("nbddp-gpus-note", note)
        self.gpus = W.SelectMultiple(
            options=[(f"GPU {i}", i) for i in range(settings.visible_gpus)],
            value=settings.gpus,
            rows=min(4, max(1, settings.visible_gpus)),
            description=PANEL.names["gpus"],
            style=_STYLE,
            layout=W.Layout(width="330px"),
        )

    def _build_buttons(self) -> W.HBox:
        """Launch, Stop, and the run's state beside them."""
        self.launch_button = W.Button(
            description="Launch",
            button_style="success",
            icon="play",
            layout=W.Layout(width="auto", min_width="148px"),
        ).add_class("nbddp-launch")
        self.stop_button = W.Button(
            description="Stop", button_style="danger", icon="stop", disabled=True
        ).add_class("nbddp-stop")
        self.run_state = W.HTML(_state_span("idle", "idle", "nbddp-run-state"))
        return W.HBox([self.launch_button, self.stop_button, self.run_state])

    def _build_run_area(self) -> list[W.Widget]:
        """Under the form: notices, the rank table, output tabs, chart, result, the code."""
        self.ranks = _html("nbddp-ranks")
        self.tabs = W.Tab(children=[]).add_class("nbddp-outputs")
        self.tabs.layout.display = "none"  # an empty box until a run has ranks
        self.chart = _html("nbddp-chart")
        self.notices = _html("nbddp-notices")
        self.result = _html("nbddp-result")
        self.code = _html("nbddp-code")
        code_box = W.Accordion(children=[self.code], titles=("Same run as code",))
        prompt = self._build_prompt()
        return [prompt, self.notices, self.ranks, self.tabs, self.chart, self.result, code_box]

    def _build_prompt(self) -> W.HBox:
        """A rank's prompt (``input()``, pdb): its words, a field, Send; hidden until asked."""
        self.prompt_label = _html("nbddp-prompt-label")
        self.prompt_input = W.Text(placeholder=_PROMPT).add_class("nbddp-prompt-input")
        self.prompt_send = W.Button(
            description="Send", button_style="primary", icon="reply"
        ).add_class("nbddp-prompt-send")
        self.prompt_send.on_click(lambda _: self._send_prompt())
        self._answered: Callable[[str], None] | None = None
        prompt = [self.prompt_label, self.prompt_input, self.prompt_send]
        self.prompt_box = W.HBox(prompt).add_class("nbddp-prompt")
        self.prompt_box.layout.display = "none"
        return self.prompt_box

    # -- the form ------------------------------------------------------------

    def settings(self) -> PanelSettings:
        """The form's current contents."""
        typed = {name: widget.value for name, widget in self.inputs.items()}
        typed["gpus"] = tuple(typed["gpus"])
        return PanelSettings(**typed, visible_gpus=self._visible_gpus)

    def on_change(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` whenever any field changes."""
        for widget in self.inputs.values():
            widget.observe(lambda _change: callback(), names="value")

    def show_device(self, device: str) -> None:
        """Show the GPU list or the process count, whichever the device needs (no
        empty GPU list: without GPUs the device's error says why)."""
        has_gpus = device == "gpu" and self._visible_gpus > 0
        self._gpu_row.layout.display = None if has_gpus else "none"
        self._procs_row.layout.display = None if device == "cpu" else "none"

    def show_title(self, title: str) -> None:
        """The panel's heading (the call it launches)."""
        self.title.value = f"<b>{html.escape(title)}</b>"

    def show_errors(self, errors: dict[str, str]) -> None:
        """Every field's message next to it and its box flagged (cleared where it is
        valid), and on the Launch button how many fields need fixing."""
        for name, label in self.errors.items():
            message = html.escape(errors.get(name, ""))
            label.value = message and f'<span style="{_ERROR_STYLE}">{message}</span>'
        # The device's error says why GPUs cannot be: the note beside it would repeat it.
        self.gpus_note.layout.display = "none" if "device" in errors else None
        for name, widget in self.inputs.items():
            (widget.add_class if name in errors else widget.remove_class)("nbddp-invalid")
        wrong = sum(name != "launch" for name in errors)
        fix = f"Fix {wrong} field{'s' * (wrong > 1)}" if wrong else "Fix the settings"
        self.launch_button.description = f"{fix} to launch" if errors else "Launch"

    def show_code(self, magic: str, call: str, note: str) -> None:
        """The ``%%ddp`` cell and the ``launch`` call for the current settings."""
        parts = []
        if magic:
            # One click selects a whole block (user-select: all), ready to copy.
            block = f'<pre class="nbddp-code-{{}}" style="{_PRE};user-select:all">{{}}</pre>'
            parts += [
                _note("as a %%ddp cell (after %load_ext nbddp):"),
                block.format("magic", html.escape(magic)),
                _note("or as a call:", ";margin-top:6px"),
                block.format("launch", html.escape(call)),
            ]
        if note:
            parts.append(_note(note, ";margin-top:6px"))
        self.code.value = "".join(parts)

    def set_running(self, running: bool, can_launch: bool) -> None:
        """Enable Stop while a run goes on, Launch when none does and the form is valid."""
        self.stop_button.disabled = not running
        self.launch_button.disabled = running or not can_launch

    def ask(self, prompt: str, answered: Callable[[str], None], password: bool = False) -> None:
        """Show a rank's ``prompt`` (it names the rank) in a field that hides what is typed
        for a ``password``; Send gives ``answered`` the line."""
        self.prompt_label.value = (
            f'<span style="font-family:monospace;white-space:pre">{html.escape(prompt)}</span>'
        )
        field = W.Password if password else W.Text
        if type(self.prompt_input) is not field:
            self.prompt_input = field(placeholder=_PROMPT).add_class("nbddp-prompt-input")
            self.prompt_box.children = (self.prompt_label, self.prompt_input, self.prompt_send)
        self.prompt_input.value = ""
        self._answered = answered
        self.prompt_box.layout.display = None

    def end_prompt(self) -> None:
        """No rank waits any more: hide the prompt."""
        self._answered = None
        self.prompt_box.layout.display = "none"

    def _send_prompt(self) -> None:
        answered, self._answered = self._answered, None
        if answered is not None:
            self.prompt_box.layout.display = "none"
            answered(self.prompt_input.value)

    def show_run_state(self, state: str, text: str | None = None) -> None:
        """The run's overall state beside the buttons (``data-state`` carries it)."""
        self.run_state.value = _state_span(state, text or state, "nbddp-run-state")

    def start_run(self, world_size: int) -> None:
        """Clear what the previous run showed and make a tab per rank."""
        self._notice_lines = []
        for shown in (self.notices, self.result, self.chart, self.ranks):
            shown.value = ""
        self.tabs.children = [_html("nbddp-rank-output") for _ in range(world_size)]
        self.tabs.titles = tuple(f"rank {r}" for r in range(world_size))
        self.tabs.layout.display = None

    def show_value(self, shown: str, hints: list[str]) -> None:
        """Rank 0's value: ``shown`` (a short repr; a block if it has several lines),
        then ``hints`` (how to get all of it, where the logs are), a line each."""
        if "\n" in shown:
            value = f'<pre class="nbddp-value" style="{_PRE}">{html.escape(shown)}</pre>'
        else:
            value = f'<code class="nbddp-value">{html.escape(shown)}</code>'
        self.result.value = f"<div>rank 0 returned {value}</div>" + "".join(
            f'<div class="nbddp-value-hint" style="{_NOTE}">{html.escape(hint)}</div>'
            for hint in hints
        )

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
        # Unchanged values are not sent again (traitlets compares them first).
        if len(ranks) == len(self.tabs.children):
            self.tabs.titles = tuple(f"rank {v.rank} · {v.state}" for v in ranks)
        for view, out in zip(ranks, self.tabs.children, strict=False):
            lines = list(view.lines)
            if view.hidden:
                log = view.log.name if view.log is not None else "its log"
                lines.insert(0, f"… {view.hidden:,} earlier lines are in {log}")
            if lines:
                value = f'<pre style="{_PRE}">{html.escape(chr(10).join(lines))}</pre>'
            else:  # an empty box reads as broken
                value = _note(f"no output from rank {view.rank}", ";padding:2px 6px")
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


def _close_tree(widget: W.Widget) -> None:
    for child in getattr(widget, "children", ()):
        _close_tree(child)
    widget.close()
