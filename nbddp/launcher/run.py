"""``Run``: the user's handle of a launch, which shows it while it goes and gives its result.

Contract: beyond what ``Run`` states, ``wait`` reads output until all of it is read (``pump.Pump``),
attaches the rank's traceback to a rebuilt exception (``failures.run_error``), and after an
interrupt waits for every rank to be gone before re-raising; anything else that escapes stops every
rank before it is raised. What the display shows is true when ``wait`` returns or raises. A ``Run``
reads its run only through ``RunSource`` (a run core, or the restarts over one).
"""

from __future__ import annotations

import html
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nbddp.launcher.config import LaunchConfig
from nbddp.launcher.events import Failure, RankOutcome, RankState, RunStatus
from nbddp.launcher.failures import release, run_error
from nbddp.launcher.logs import read_rank_log
from nbddp.launcher.prompts import Asker, ask_rank, withdraw_prompt
from nbddp.launcher.pump import Display, Pump, RunSource
from nbddp.launcher.results import Metrics, RunResult, UnloadedValue, load_values

__all__ = ["Run", "RunResult", "RunSource", "RunStatus", "UnloadedValue", "latest_run"]


_LATEST: weakref.ref[Run] | None = None
_LATEST_LOGS: tuple[Path, int] | None = None  # outlives the run: logs are kept


def latest_run() -> Run | None:
    """The most recently started run in this process, from any entry point, if alive."""
    return _LATEST() if _LATEST is not None else None


def latest_logs() -> tuple[Path, int] | None:
    """The log directory and rank count of the most recently started run in this
    process, even once its ``Run`` is gone (as after a blocking ``launch``)."""
    return _LATEST_LOGS


class Run:
    """A launched run: ``launch(..., block=False)`` returns one, as ``spawn(join=False)``.

    ``wait()`` shows the output until every rank has finished, then returns a ``RunResult`` or
    raises the root-cause failure (the earliest failing rank's own exception when it can be rebuilt
    here, else ``RemoteError`` or ``RankExitedError``); Ctrl-C in ``wait()`` stops every rank.
    ``stop()``, ``dump_stacks()``, ``status``, ``rank_states()``, ``pids`` and ``output(rank)`` work
    while it runs.
    """

    def __init__(self, job: RunSource, display: Display | None, config: LaunchConfig) -> None:
        global _LATEST, _LATEST_LOGS
        self.job = job
        self._config = config
        self.display = display
        self.metrics = Metrics()
        """Rows sent with ``nbddp.log`` so far, in arrival order (``metrics.to_pandas()``)."""
        self._result: RunResult | None = None
        self.asker: Asker = ask_rank
        """Asks the user for a waiting rank's line (``input()`` where it asks, naming
        the rank; the panel sets its own)."""
        self.withdraw: Callable[[threading.Thread], None] = withdraw_prompt
        """Ends ``asker``'s wait in the given thread: the prompt's rank or run ended."""
        self.pump = Pump(self)
        self._shown: list[tuple[Any, dict[str, str]]] = []  # (handle, bundle) per drawn line
        if display is not None:
            display.attach(job.log_dir, len(job.outcomes()))
        _LATEST = weakref.ref(self)
        _LATEST_LOGS = (job.log_dir, len(job.outcomes()))

    @property
    def config(self) -> LaunchConfig:
        """The validated options the run was launched with."""
        return self._config

    @property
    def run_id(self) -> str:
        """The run's id (also in its log directory's name)."""
        return self.job.run_id

    def ended(self, timeout: float | None = 0.0) -> bool:
        """True once every rank has exited, all output is read and a background run's last frame
        drawn; waits up to ``timeout`` seconds (None: as long as it takes), showing nothing."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self.job.wait(timeout):
            return False
        if (watcher := self.pump.watching()) is not None:
            # Its final frame is part of the run: drawn after this, it would land in
            # whichever cell runs then.
            watcher.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            return not watcher.is_alive()
        return True

    @property
    def log_dir(self) -> Path:
        """The run's log directory."""
        return self.job.log_dir

    @property
    def status(self) -> RunStatus:
        """starting, running, done, failed, stopped, timeout or interrupted."""
        return self.job.status

    @property
    def pids(self) -> dict[int, int]:
        """Rank -> pid."""
        return self.job.pids()

    @property
    def root_cause(self) -> Failure | None:
        """The failure that ended the run, if one did: the rank, how, what it raised."""
        return self.job.root_cause

    @property
    def elapsed(self) -> float:
        """Seconds since the run started, until it ended."""
        return self.job.elapsed()

    def __repr__(self) -> str:
        """``<nbddp Run <id>: running, 2 ranks (2 running), 1m05s>``."""
        return f"<nbddp Run {_line(self)}>"

    def _repr_html_(self) -> str:
        """The same line in a notebook, with where the logs are (all of it escaped)."""
        return (
            '<div class="nbddp-run" style="font-family:monospace">'
            f"nbddp run {html.escape(_line(self))}<br>"
            f'<span style="opacity:0.7">logs in {html.escape(str(self.log_dir))}</span></div>'
        )

    def _ipython_display_(self) -> None:
        """Both lines; in a kernel, redrawn in place (``redraw``) until the run has ended."""
        from IPython import get_ipython
        from IPython.display import display

        bundle = {"text/plain": repr(self), "text/html": self._repr_html_()}
        handle = display(bundle, raw=True, display_id=True)  # type: ignore[no-untyped-call]
        if getattr(get_ipython(), "kernel", None) is not None and not self.pump.done:
            self._shown.append((handle, bundle))

    def redraw(self) -> None:
        """Bring the lines ``_ipython_display_`` drew up to date (the run's pump calls it)."""
        shown, self._shown = self._shown, []  # a line that fails to draw is dropped
        for handle, drawn in shown:
            bundle = {"text/plain": repr(self), "text/html": self._repr_html_()}
            if bundle != drawn:
                handle.update(bundle, raw=True)
            self._shown.append((handle, bundle))

    def outcomes(self) -> tuple[RankOutcome, ...]:
        """Each rank's state, pid, exit code, value and error, as last seen."""
        return self.job.outcomes()

    def rank_states(self) -> dict[int, RankState]:
        """Rank -> starting, running, done, failed or stopped."""
        return {o.rank: o.state for o in self.job.outcomes()}

    def output(self, rank: int) -> str:
        """Everything ``rank`` wrote so far (stdout and stderr, as they arrived)."""
        return self.log(rank)

    def log(self, rank: int, tail: int | None = None) -> str:
        """The text of ``rank``'s log so far: everything it wrote (stdout and stderr,
        as they arrived, and its traceback if it raised), or its last ``tail`` lines."""
        return read_rank_log(self.log_dir, rank, len(self.job.outcomes()), tail)

    def stop(self) -> None:
        """Stop every rank; returns at once (``wait()`` to wait for them)."""
        self.job.stop(RunStatus.STOPPED)

    def dump_stacks(self) -> None:
        """Have every running rank write its threads' Python stacks into its output."""
        self.job.dump_stacks()

    def wait(self, timeout: float | None = None) -> RunResult:
        """Show output until the run ends; return its result or raise its failure. With
        ``timeout``, ``TimeoutError`` if it has not ended by then (``stop()`` ends it)."""
        if self._result is None:
            deadline = None if timeout is None else time.monotonic() + timeout
            try:
                self.pump.follow(deadline)
            except KeyboardInterrupt:
                self.pump.interrupt()
                raise
            except TimeoutError:
                raise  # the run goes on, as documented
            except BaseException:
                # Nothing should get here (display errors are handled in the pump);
                # whatever does, the ranks must not outlive it.
                self.pump.stop_and_drain(RunStatus.STOPPED)
                raise
            self._result = _result(self)
        if self._result.failure is not None:
            raise self._result.failure
        return self._result

    def join(self, timeout: float | None = None) -> bool:
        """torch's ``ProcessContext.join``: True once every rank has ended (raises on failure)."""
        try:
            self.wait(timeout)
        except TimeoutError:
            if self._result is None:
                return False
            raise
        return True

    def watch(self) -> None:
        """Show the run live from a thread of its own until it ends; returns at once
        (``launch(block=False)``). Nothing happens if it is already watched or over."""
        self.pump.watch()


def _result(run: Run) -> RunResult:
    """The result of ``run``, which has ended (its failure in it, not raised)."""
    job = run.job
    outcomes = job.outcomes()
    values, unloaded = load_values(outcomes, run.log_dir)
    timeout = run.config.job.timeout
    failure = run_error(job.root_cause, job.status, outcomes, run.log_dir, timeout)
    release(outcomes)  # the other ranks' exceptions' shared memory: never rebuilt
    return RunResult(
        values=values,
        exit_codes={o.rank: o.exit_code for o in outcomes},
        log_dir=run.log_dir,
        metrics=Metrics(run.metrics),
        failure=failure or unloaded,
        duration=job.elapsed(),
    )


def format_elapsed(seconds: float) -> str:
    """``7s``, ``3m05s`` or ``1h02m``."""
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _line(run: Run) -> str:
    """``<run id>: <status>, <n> ranks (<count> <state>, …), <elapsed>``."""
    counts = Counter(str(o.state) for o in run.job.outcomes())
    world = sum(counts.values())
    ranks = ", ".join(f"{count} {state}" for state, count in counts.items())
    noun = "rank" if world == 1 else "ranks"
    return f"{run.run_id}: {run.status}, {world} {noun} ({ranks}), {format_elapsed(run.elapsed)}"
