"""``Panel``: configure, launch, stop and watch runs of one function from widgets.

A ``Panel`` owns a ``PanelView`` and at most one run. The form is validated on each change
(``PanelSettings.validate``, which builds the config Launch uses); Launch (button or ``launch()``)
runs ``fn(*args, **kwargs)``, the form's keyword arguments over ``kwargs``, with a ``PanelFeed``
display pumped on a background thread, then shows the outcome and keeps ``panel.run`` and
``panel.value``. Stop (button or ``stop()``) stops every rank, answering a waiting prompt with end
of input. Whatever fails while a run is shown, the panel ends in a final state. ``close()``, or
re-running or deleting its cell, stops the run and closes the widgets.
"""

from __future__ import annotations

import inspect
import sys
import threading
from collections.abc import Callable, Mapping

from nbddp.entry import kernel_shell, start_with_display
from nbddp.errors import ConfigError
from nbddp.launcher.devices import VisibleGpus, visible_gpus
from nbddp.launcher.events import RunStatus
from nbddp.launcher.failures import summary
from nbddp.launcher.options import LaunchOptions
from nbddp.launcher.prompts import prompt_for
from nbddp.launcher.run import Run, RunResult
from nbddp.launcher.spelling import PANEL, check_call
from nbddp.notebook.panel.code import CallSource, bound_name, call_source, literal_source, run_code
from nbddp.notebook.panel.feed import PanelFeed
from nbddp.notebook.panel.settings import PanelSettings, Validated
from nbddp.notebook.panel.view import PanelView

PANEL_TAIL = 15  # lines of each rank's output in its tab (the full output is in its log)
CLOSE_WAIT = 10.0  # seconds close() waits for a stopped run's ranks to be gone
_MAX_VALUE_REPR = 400  # characters of rank 0's value the panel shows
_MAX_VALUE_LINES = 8
_MAX_TITLE = 100  # characters of the call in the panel's heading


class Panel:
    """A widget panel for ``fn(*args, **kwargs)``."""

    def __init__(
        self,
        fn: Callable[..., object],
        args: tuple[object, ...] = (),
        kwargs: Mapping[str, object] | None = None,
        *,
        options: LaunchOptions | None = None,
        namespace: Mapping[str, object] | None = None,
    ) -> None:
        """``namespace``: the notebook's names, for the code (default: the kernel's, or
        ``__main__``'s)."""
        if not callable(fn):
            raise ConfigError(f"nbddp.panel needs a function to run, got {type(fn).__name__}")
        self.fn, self.args = fn, tuple(args)
        self.kwargs = dict(kwargs or {})
        """The keyword arguments given to the panel (the form's are laid over them)."""
        # Why here too: no panel for a call that cannot bind (Launch checks it again).
        with PANEL.speaking():
            check_call(fn, self.args, self.kwargs)
        self.namespace = _notebook_namespace() if namespace is None else namespace
        self.run: Run | None = None
        """The latest run started from this panel (running or ended)."""
        self.name = getattr(fn, "__name__", None) or type(fn).__name__
        # Keyword arguments that read back as literals go into the form's field.
        typed = {k: literal_source(v) for k, v in self.kwargs.items()}
        self._kept = {k: v for k, v in self.kwargs.items() if typed[k] is None}
        kwargs_text = ", ".join(f"{k}={text}" for k, text in typed.items() if text is not None)
        gpus = visible_gpus()
        settings = PanelSettings.initial(len(gpus), options, kwargs_text)
        self.view = PanelView(f"nbddp · {self.name}", settings, gpu_words(gpus), _kwargs_hint(fn))
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._answered: threading.Event | None = None  # set when a rank's prompt is answered
        self._answer_text: str | None = None
        self._stopping = False  # Stop was asked for the current run: no prompt waits
        self._shown_in: object = None  # the execution count of the cell that showed it
        self._checked: tuple[PanelSettings, Validated] | None = None  # the form, validated
        self.view.on_change(self.refresh_form)
        self.view.launch_button.on_click(lambda _button: self._clicked(self.launch))
        self.view.stop_button.on_click(lambda _button: self._clicked(self.stop))
        self.refresh_form()

    # -- state ----------------------------------------------------------------

    @property
    def running(self) -> bool:
        """True while a run launched from this panel goes on (shown, or not ended)."""
        shown = self._thread is not None and self._thread.is_alive()
        return shown or (self.run is not None and not self.run.ended())

    def settings(self) -> PanelSettings:
        """What the form holds now."""
        return self.view.settings()

    @property
    def value(self) -> object:
        """Rank 0's return value of the latest run (in full, not the panel's short repr); raises
        its failure as ``wait()`` does, ``RuntimeError`` while none was launched or it goes on."""
        if self.running:
            raise RuntimeError("the run is still going; wait() waits for it and returns its result")
        return self.wait().values.get(0)  # raises when nothing was launched yet

    def code(self) -> tuple[str, str]:
        """The ``%%ddp`` cell and the ``nbddp.launch(...)`` call for the current settings;
        ``ConfigError`` while the form is invalid."""
        settings = self.settings()
        checked = self._validated(settings)
        if checked.errors:
            raise ConfigError(_describe(checked.errors))
        return run_code(self._source(checked), settings)

    def _call_kwargs(self, checked: Validated) -> dict[str, object]:
        """The keyword arguments a launch passes: the form's over those kept aside."""
        return {**self._kept, **checked.kwargs}

    def _source(self, checked: Validated) -> CallSource:
        return call_source(self.fn, self.args, self._call_kwargs(checked), self.namespace)

    def _validated(self, settings: PanelSettings) -> Validated:
        """``settings`` validated: as last time when the form has not changed since."""
        if self._checked is None or self._checked[0] != settings:
            checked = settings.validate(
                lambda kw: check_call(self.fn, self.args, {**self._kept, **kw})
            )
            self._checked = (settings, checked)
        return self._checked[1]

    def refresh_form(self) -> None:
        """Re-validate the form: field errors, the Launch button and the code shown."""
        settings = self.settings()
        self.view.show_device(settings.device)
        self._checked = None  # a change: check anew (the machine may have changed too)
        checked = self._validated(settings)
        errors = checked.errors
        self.view.show_errors(errors)
        self.view.set_running(self.running, can_launch=not errors and not self._closed)
        if errors:
            self.view.show_code("", "", "Fix the settings above to see the equivalent code.")
            return
        source = self._source(checked)
        self.view.show_title(f"nbddp · {_cut(source.call(), _MAX_TITLE)}")
        magic, launch = run_code(source, settings)
        note = "" if source.complete else "Define the names the comments list, then run it."
        self.view.show_code(magic, launch, note)

    # -- actions ----------------------------------------------------------------

    def launch(self) -> Run:
        """Start a run with the form's settings, in the background; return its handle. Raises
        ``ConfigError`` if the form is invalid, ``RuntimeError`` if a run from this panel still
        goes on or the panel was closed, ``PayloadError`` if the call cannot be sent."""
        with self._lock:
            if self._closed:
                raise RuntimeError("this panel was closed; create a new one with nbddp.panel(...)")
            if self.running:
                raise RuntimeError("a run from this panel is still going; stop it or wait for it")
            checked = self._validated(self.settings())
            if checked.config is None:
                self.view.show_errors(checked.errors)
                raise ConfigError(_describe(checked.errors))
            self.view.start_run(checked.config.job.world_size)
            feed = PanelFeed(self.view, tail=PANEL_TAIL)
            kwargs = self._call_kwargs(checked)
            with PANEL.speaking():
                run = start_with_display(checked.config, self.fn, self.args, kwargs, feed)
            self.run = run
            self._stopping = False
            run.asker = self._ask
            run.withdraw = lambda _thread: self._answer(None)
            self.view.show_run_state(RunStatus.RUNNING)
            self.view.set_running(True, can_launch=False)
            self._thread = threading.Thread(
                target=self._pump, args=(run,), name="nbddp-panel", daemon=True
            )
            self._thread.start()
            return run

    def stop(self) -> None:
        """Stop the run (every rank gets SIGTERM, then SIGKILL); returns at once."""
        with self._lock:
            self._stopping = True
        self._answer(None)  # a rank at a prompt reads end of input
        run = self.run
        if run is not None and not run.ended():
            self.view.show_run_state("stopping", "stopping…")
            run.stop()

    def wait(self, timeout: float | None = None) -> RunResult:
        """Wait for the current run to end; return its result or raise its failure
        (``TimeoutError`` if it is still going after ``timeout`` seconds)."""
        run, thread = self.run, self._thread
        if run is None or thread is None:
            raise RuntimeError("nothing was launched from this panel yet; click Launch first")
        thread.join(timeout)
        if thread.is_alive():
            raise TimeoutError("the run is still going; call stop() to end it")
        return run.wait()

    def close(self, wait: bool = True) -> None:
        """Stop the run (waiting up to ``CLOSE_WAIT`` s for its ranks if ``wait``) and
        close the widgets. The panel cannot launch again afterwards."""
        with self._lock:
            self._closed = True
        self.stop()
        thread, run = self._thread, self.run
        if wait and thread is not None:
            thread.join(CLOSE_WAIT)
        if wait and run is not None:
            run.ended(CLOSE_WAIT)  # its ranks are gone even if nothing pumps it any more
        self.view.close()

    # -- internals ----------------------------------------------------------------

    def _clicked(self, action: Callable[[], object]) -> None:
        # Why catch everything: an exception in a button callback would only
        # reach the kernel's log; the user must see it in the panel.
        try:
            action()
        except Exception as exc:
            self.view.show_run_state("error", "not launched")
            self.view.show_result(f"{type(exc).__name__}: {exc}")

    def _ask(self, rank: int, prompt: str, password: bool = False) -> str | None:
        """A rank's prompt, in the panel (``Run.asker``; the pump thread waits here)."""
        answered = threading.Event()
        with self._lock:
            if self._stopping:
                return None
            self._answered, self._answer_text = answered, None
        self.view.ask(prompt_for(rank, prompt), self._answer, password)
        answered.wait()
        self.view.end_prompt()
        return self._answer_text

    def _answer(self, text: str | None) -> None:
        with self._lock:
            answered, self._answered = self._answered, None
            self._answer_text = text
        if answered is not None:
            answered.set()

    def _pump(self, run: Run) -> None:
        try:
            try:
                result = run.wait()
            except BaseException as exc:
                self._show_failure(run, exc)
            else:
                self._show_done(result)
        except Exception as exc:  # showing the outcome failed: say so, never stay "running"
            self.view.show_run_state("error", "error")
            self.view.show_result(f"nbddp could not show the run's outcome: {_safe_repr(exc)}")
        finally:
            running = not run.ended()  # only if wait itself broke: Stop must stay usable
            valid = not self._validated(self.settings()).errors
            self.view.set_running(running, can_launch=valid and not self._closed)

    def _show_done(self, result: RunResult) -> None:
        self.view.show_run_state(RunStatus.DONE, f"done in {result.duration:.1f}s")
        me = bound_name(self.namespace, self) or _out_name(self.namespace, self)
        self.view.show_value(
            _safe_repr(result.values.get(0)),
            [
                f"full value: {me}.value · every rank's values and metrics: {me}.wait()",
                f"each rank's output is in {result.log_dir}",
            ],
        )

    def _show_failure(self, run: Run, exc: BaseException) -> None:
        status = run.status
        if status in (RunStatus.STOPPED, RunStatus.INTERRUPTED):
            self.view.show_run_state(RunStatus.STOPPED)
            self.view.show_result(f"stopped; each rank's output is in {run.log_dir}")
            return
        if not run.ended():
            # Not the run's failure: showing it broke. The run goes on until stopped.
            self.view.show_run_state("error", "display error")
            self.view.show_result(
                f"the run could not be shown ({_safe_repr(exc)}); Stop ends it, and each "
                f"rank's output is in {run.log_dir}"
            )
            return
        self.view.show_run_state(RunStatus.FAILED if status is RunStatus.DONE else status)
        self.view.show_result(*summary(exc, run.root_cause))

    def show(self) -> None:
        """Display the panel in the running cell (once per cell: a panel that
        ``nbddp.panel`` already showed is not shown again as the cell's result)."""
        from IPython import get_ipython
        from IPython.display import display

        cell = getattr(get_ipython(), "execution_count", None)
        if cell is not None and cell == self._shown_in:
            return
        self._shown_in = cell
        display(self.view.root)  # type: ignore[no-untyped-call]

    def _ipython_display_(self) -> None:
        self.show()


def gpu_words(gpus: VisibleGpus) -> str:
    """What the panel says about the GPUs it found, in plain words."""
    hidden_by = gpus.source if gpus.source.startswith("CUDA_VISIBLE_DEVICES=") else ""
    if not gpus:
        if hidden_by:
            return f"No GPU visible to this notebook ({hidden_by}): runs use CPU processes (gloo)."
        return "No GPU found on this machine: runs use CPU processes (gloo)."
    count = f"{len(gpus)} GPU{'s' * (len(gpus) > 1)}"
    return f"{count} visible to this notebook ({hidden_by})." if hidden_by else f"{count} found."


def _kwargs_hint(fn: Callable[..., object]) -> str:
    """The field's placeholder: the function's keyword parameters with their defaults."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        params = []
    shown = [
        f"{p.name}={text}"
        for p in params
        if p.default is not inspect.Parameter.empty
        and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        and (text := literal_source(p.default, 30)) is not None
    ]
    return f"e.g. {', '.join(shown[:4])}" if shown else "e.g. epochs=3, lr=0.1"


def _out_name(namespace: Mapping[str, object], panel: Panel) -> str:
    """How the notebook reaches a panel bound to no name: ``Out[n]``, else in words."""
    out = namespace.get("Out")
    for number, bound in list(out.items()) if isinstance(out, dict) else ():
        if bound is panel:
            return f"Out[{number}]"
    return "panel"


def _notebook_namespace() -> Mapping[str, object]:
    """The notebook's names: the kernel's user namespace, else ``__main__``'s."""
    shell = kernel_shell()
    if shell is not None:
        return shell.user_ns
    main = sys.modules.get("__main__")
    return vars(main) if main is not None else {}


def _safe_repr(value: object) -> str:
    """``repr(value)`` cut to ``_MAX_VALUE_REPR`` characters and ``_MAX_VALUE_LINES``
    lines; never raises."""
    try:
        text = repr(value)
    except Exception as exc:
        return f"<{type(value).__name__} object; its repr raised {type(exc).__name__}>"
    lines = text.splitlines() or [""]
    if len(lines) > _MAX_VALUE_LINES:
        text = "\n".join([*lines[:_MAX_VALUE_LINES], "…"])
    return _cut(text, _MAX_VALUE_REPR)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def _describe(errors: Mapping[str, str]) -> str:
    return "; ".join(f"{name.replace('_', ' ')}: {message}" for name, message in errors.items())
