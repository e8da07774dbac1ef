"""``Panel``: configure, launch, stop and watch runs of one function from widgets.

Contract: a ``Panel`` owns a ``PanelView`` and at most one run at a time.
The form is validated once per change (``PanelSettings.validate``, which
builds the launch's config). Launch (the button, or ``launch()``) starts the
run with that same config and a ``PanelFeed`` as its display, and pumps it
on a background thread, so the notebook stays usable; the outcome (summary,
or the failing rank's error and traceback) is shown in the panel and the run
stays reachable as ``panel.run``. Stop (the button, or ``stop()``) stops every rank; the panel
then shows ``stopped``. Launch is disabled while the form is invalid or a
run goes on; launching again after a run ends starts a fresh run.

Whatever goes wrong while a run is shown (its display, its result's
``repr``, ``Run.wait`` itself), the panel ends in a final state with Launch
and Stop set to match, and Stop and ``close()`` stop every rank of a run that
has not ended, whether or not its pump thread is still alive.

No processes are left behind: ``close()`` stops the run and closes the
widgets; in a kernel, running the panel's cell again or deleting the cell
(JupyterLab reports deleted cells with the next execution) closes it;
and ranks end with the kernel in any case (each watches its link).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

from nbddp.entry import start_with_display
from nbddp.errors import ConfigError
from nbddp.launcher.devices import visible_gpus
from nbddp.launcher.events import RunStatus
from nbddp.launcher.failures import summary
from nbddp.launcher.options import LaunchOptions
from nbddp.launcher.run import Run, RunResult
from nbddp.launcher.signature import check_call
from nbddp.launcher.spelling import PANEL
from nbddp.notebook.panel.feed import PanelFeed
from nbddp.notebook.panel.settings import PanelSettings, Validated, call_code
from nbddp.notebook.panel.view import PanelView

PANEL_TAIL = 15  # lines of each rank's output in its tab (the full output is in its log)
CLOSE_WAIT = 10.0  # seconds close() waits for a stopped run's ranks to be gone
_MAX_VALUE_REPR = 200


class Panel:
    """A widget panel for ``fn(*args, **kwargs)`` (see module contract)."""

    def __init__(
        self,
        fn: Callable[..., object],
        args: tuple[object, ...] = (),
        kwargs: Mapping[str, object] | None = None,
        *,
        options: LaunchOptions | None = None,
        tail: int = PANEL_TAIL,
    ) -> None:
        if not callable(fn):
            raise ConfigError(f"nbddp.panel needs a function to run, got {type(fn).__name__}")
        # Why here too: no panel for a call that cannot bind (Launch checks it again).
        with PANEL.speaking():
            check_call(fn, tuple(args), dict(kwargs or {}))
        self.fn = fn
        self.args = tuple(args)
        self.kwargs = dict(kwargs or {})
        self.tail = tail
        self.run: Run | None = None
        """The latest run started from this panel (running or ended)."""
        name = getattr(fn, "__name__", None) or type(fn).__name__
        self.name = name
        # The name the code shown uses: a lambda or a callable object has none.
        self.code_name = name if name.isidentifier() else "fn"
        gpus = visible_gpus()
        settings = PanelSettings.initial(len(gpus), options)
        self.view = PanelView(f"nbddp · {self.name}", settings, f"GPUs: {gpus.describe()}")
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False
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
        thread = self._thread
        if thread is not None and thread.is_alive():
            return True
        return self.run is not None and not self.run.ended()

    def settings(self) -> PanelSettings:
        """What the form holds now."""
        return self.view.settings()

    def code(self) -> tuple[str, str]:
        """The ``%%ddp`` cell and the ``nbddp.launch(...)`` call for the current settings.

        Raises ``ConfigError`` while the form is invalid.
        """
        settings = self.settings()
        errors = self._validated(settings).errors
        if errors:
            raise ConfigError(_describe(errors))
        return self._code(settings)[:2]

    def _code(self, settings: PanelSettings) -> tuple[str, str, bool]:
        """The code for valid ``settings``, and whether it is exact (see ``call_code``)."""
        args, exact = call_code(self.args, self.kwargs)
        name = self.code_name
        return settings.magic_cell(f"{name}({args})"), settings.launch_call(name, args), exact

    def _validated(self, settings: PanelSettings) -> Validated:
        """``settings`` validated: as last time when the form has not changed since."""
        if self._checked is None or self._checked[0] != settings:
            self._checked = (settings, settings.validate())
        return self._checked[1]

    def refresh_form(self) -> None:
        """Re-validate the form: field errors, the Launch button and the code shown."""
        settings = self.settings()
        self.view.show_device(settings.device)
        self._checked = None  # a change: check anew (the machine may have changed too)
        errors = self._validated(settings).errors
        self.view.show_errors(errors)
        self.view.set_running(self.running, can_launch=not errors and not self._closed)
        if errors:
            self.view.show_code("", "", "Fix the settings above to see the equivalent code.")
            return
        magic, call, exact = self._code(settings)
        notes = []
        if self.code_name != self.name:
            notes.append(f"fn stands for the function given to nbddp.panel ({self.name}).")
        if not exact:
            notes.append("args[i] and kwargs[...] stand for the objects given to nbddp.panel.")
        note = " ".join(notes)
        self.view.show_code(magic, call, note)

    # -- actions ----------------------------------------------------------------

    def launch(self) -> Run:
        """Start a run with the form's settings, in the background; return its handle.

        Raises ``ConfigError`` if the form is invalid, ``RuntimeError`` if a
        run from this panel still goes on or the panel was closed, and
        ``PayloadError`` if ``fn`` or its arguments cannot be sent.
        """
        with self._lock:
            if self._closed:
                raise RuntimeError("this panel was closed; create a new one with nbddp.panel(...)")
            if self.running:
                raise RuntimeError("a run from this panel is still going; stop it or wait for it")
            checked = self._validated(self.settings())
            if checked.config is None:
                self.view.show_errors(checked.errors)
                raise ConfigError(_describe(checked.errors))
            config = checked.config
            self.view.start_run(config.job.world_size)
            feed = PanelFeed(self.view, tail=self.tail)
            with PANEL.speaking():
                run = start_with_display(config, self.fn, self.args, self.kwargs, feed)
            self.run = run
            self.view.show_run_state(RunStatus.RUNNING)
            self.view.set_running(True, can_launch=False)
            self._thread = threading.Thread(
                target=self._pump, args=(run,), name="nbddp-panel", daemon=True
            )
            self._thread.start()
            return run

    def stop(self) -> None:
        """Stop the run (every rank gets SIGTERM, then SIGKILL); returns at once."""
        run = self.run
        if run is not None and not run.ended():
            self.view.show_run_state("stopping", "stopping…")
            run.stop()

    def wait(self, timeout: float | None = None) -> RunResult:
        """Wait for the current run to end; return its result or raise its failure.

        Raises ``TimeoutError`` if it is still going after ``timeout`` seconds.
        """
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
            can_launch = not running and not self._closed
            self.view.set_running(
                running, can_launch=can_launch and not self._validated(self.settings()).errors
            )

    def _show_done(self, result: RunResult) -> None:
        text = _safe_repr(result.values.get(0))
        self.view.show_run_state(RunStatus.DONE, f"done in {result.duration:.1f}s")
        self.view.show_result(f"rank 0 returned {text}; logs in {result.log_dir}")

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


def _safe_repr(value: object) -> str:
    """``repr(value)`` cut to ``_MAX_VALUE_REPR`` characters; never raises."""
    try:
        text = repr(value)
    except Exception as exc:
        return f"<{type(value).__name__} object; its repr raised {type(exc).__name__}>"
    return text if len(text) <= _MAX_VALUE_REPR else text[:_MAX_VALUE_REPR] + "…"


def _describe(errors: Mapping[str, str]) -> str:
    return "; ".join(f"{name.replace('_', ' ')}: {message}" for name, message in errors.items())
