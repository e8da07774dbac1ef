"""``Run`` (the handle of a launch) and ``RunResult`` (what it produced).

Contract: ``Run.wait()`` shows the run's output through its display while
it goes on, returns a ``RunResult`` when every rank has finished and all
output has been read, and raises the root-cause failure otherwise: the
earliest failing rank's exception with its original type when it can be
rebuilt here (the rank's traceback attached as the ``__cause__`` and in a
note), else ``WorkerError``/``RankExitedError`` (``failures.run_error``).
Its large tensors are mapped from the shared memory they came in; that of
the other ranks' exceptions, never rebuilt, is closed once the result is
built (``failures.release``).
``KeyboardInterrupt`` during ``wait`` stops every rank, waits for them to
be gone, and re-raises.

Values: each rank's return value is rebuilt once, on the shared memory it
came with (``values.unpack``). Only rank 0's value can fail the run (a
``ResultError`` naming the rank, the value's type and why, when the run did
not fail otherwise); another rank's value that cannot be rebuilt is an
``UnloadedValue`` in ``RunResult.values``, which says why.

A ``Run`` reads its job only through ``RunSource``: typed events, rank
outcomes, the root cause and the status.

Display pump: typed events (output chunks, states, metrics) are taken from
the job's queue in the waiting thread, in batches (everything queued, up to
``BATCH_SECONDS`` of work), and handed to the display, which only records
them; between batches the display's ``refresh()`` draws at its own rate and
says when it next needs a call, and the queue wait ends then. So however
fast ranks write, drawing stays bounded, and nothing queued before
``wait`` (``block=False``) is skipped. ``close()`` draws the final state
once every rank's output is complete.

Display errors: nothing a display raises reaches the caller or stops the
pump. The first error is reported once, on stderr, and the rest of the run
(starting with the event it failed on) is shown by a ``TextDisplay`` of the
same ranks; if that fails too, the run goes on with no display (every rank's
log keeps all its output either way). Metric rows reach ``Run.metrics``
whatever the display does. Should anything else escape the pump, every rank
is stopped before it is raised: a broken ``wait`` never leaves ranks running.
"""

from __future__ import annotations

import queue
import signal
import sys
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from nbddp.display.protocol import Display
from nbddp.display.text import TextDisplay
from nbddp.errors import ResultError
from nbddp.launcher import events as ev
from nbddp.launcher.config import LaunchConfig
from nbddp.launcher.events import Failure, RankOutcome, RankState, RunEvent, RunStatus
from nbddp.launcher.failures import release, run_error
from nbddp.launcher.logs import rank_log
from nbddp.launcher.metrics import Metrics
from nbddp.wire.payload import short_error
from nbddp.wire.values import unpack

STOP_WAIT = 30.0  # seconds to wait for ranks to go after a stop, beyond kill_grace
POLL = 0.5  # longest queue wait: KeyboardInterrupt and deadlines are checked between waits
BATCH_SECONDS = 0.05  # longest stretch of event handling before the display may draw
BATCH_PAUSE = 0.05  # after a batch, let events gather this long before taking the next
_MAX_ERROR_TEXT = 200  # characters of a display error's message in its one-line report


@dataclass
class RunResult:
    """Everything a finished run produced, keyed by rank."""

    values: dict[int, Any]
    """Each rank's return value (CUDA tensors moved to CPU)."""
    exit_codes: dict[int, int | None]
    """Each rank's exit code; negative: killed by that signal; None: unknown."""
    log_dir: Path
    """The run's directory: ``rank{N}.log`` holds everything rank N wrote."""
    metrics: Metrics = field(default_factory=Metrics)
    """Rows sent with ``nbddp.log``, in arrival order (``metrics.to_pandas()``)."""
    failure: BaseException | None = None
    """The root-cause error, if the run failed."""
    duration: float = 0.0
    """Seconds from start until the last rank's output was complete."""

    def is_failed(self) -> bool:
        """True if any rank failed or the run was stopped."""
        return self.failure is not None

    def log_path(self, rank: int) -> Path:
        """The full log of ``rank``."""
        return rank_log(self.log_dir, rank)


@dataclass(frozen=True)
class UnloadedValue:
    """Stands in ``RunResult.values`` for a rank's value that cannot be rebuilt here."""

    rank: int
    type_name: str
    """The value's type in the rank."""
    reason: str
    """What rebuilding it raised."""

    def __repr__(self) -> str:
        return (
            f"<rank {self.rank}'s return value ({self.type_name}) "
            f"could not be rebuilt in the notebook: {self.reason}>"
        )


class RunSource(Protocol):
    """What a ``Run`` reads from its job (``launcher.job.Job``): typed values only."""

    events: queue.SimpleQueue[RunEvent]
    log_dir: Path
    config: LaunchConfig
    run_id: str

    @property
    def root_cause(self) -> Failure | None:
        """The run's root-cause failure, if any."""

    @property
    def status(self) -> RunStatus:
        """Where the run is; once it has ended, how it ended."""

    def outcomes(self) -> tuple[RankOutcome, ...]:
        """Each rank as last seen."""

    def wait(self, timeout: float | None = None) -> bool:
        """True once the run has ended and all output has been read."""

    def elapsed(self) -> float:
        """Seconds since the start, until the end."""

    def pids(self) -> dict[int, int]:
        """Rank -> pid."""

    def stop(self, reason: RunStatus = RunStatus.STOPPED) -> None:
        """Stop every rank."""

    def dump_stacks(self) -> None:
        """Have every running rank dump its stacks."""


_LATEST: weakref.ref[Run] | None = None


def latest_run() -> Run | None:
    """The most recently started run in this process, from any entry point, if alive."""
    return _LATEST() if _LATEST is not None else None


class Run:
    """A launched run (see module contract)."""

    def __init__(self, job: RunSource, display: Display | None) -> None:
        global _LATEST
        self.job = job
        self.display = display
        self.metrics = Metrics()
        """Rows sent with ``nbddp.log`` so far, in arrival order (``metrics.to_pandas()``)."""
        self._result: RunResult | None = None
        self._refresh_at: float | None = None  # when the display next wants a refresh
        self._done = False  # the job's last event (``Done``) was taken from its queue
        self._text_fallback = False  # the display failed and was replaced by text
        self._world_size = len(job.outcomes())
        if display is not None:
            try:
                display.attach(job.log_dir, self._world_size)
            except Exception as exc:
                self._display_failed(exc)
        _LATEST = weakref.ref(self)

    @property
    def config(self) -> LaunchConfig:
        """The validated options the run was launched with."""
        return self.job.config

    @property
    def run_id(self) -> str:
        """The run's id (also in its log directory's name)."""
        return self.job.run_id

    def ended(self, timeout: float | None = 0.0) -> bool:
        """True once every rank has exited and all output has been read; waits up to
        ``timeout`` seconds for that (None: as long as it takes), showing nothing."""
        return self.job.wait(timeout)

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

    def outcomes(self) -> tuple[RankOutcome, ...]:
        """Each rank's state, pid, exit code, value and error, as last seen."""
        return self.job.outcomes()

    def rank_states(self) -> dict[int, RankState]:
        """Rank -> starting, running, done, failed or stopped."""
        return {o.rank: o.state for o in self.job.outcomes()}

    def output(self, rank: int) -> str:
        """Everything ``rank`` wrote so far (stdout and stderr, as they arrived)."""
        try:
            return rank_log(self.log_dir, rank).read_bytes().decode("utf-8", "replace")
        except FileNotFoundError:
            return ""

    def stop(self) -> None:
        """Stop every rank; returns at once (``wait()`` to wait for them)."""
        self.job.stop(RunStatus.STOPPED)

    def dump_stacks(self) -> None:
        """Have every running rank write its threads' Python stacks into its output."""
        self.job.dump_stacks()

    def wait(self, timeout: float | None = None) -> RunResult:
        """Show output until the run ends; return its result or raise its failure.

        With ``timeout``, raise ``TimeoutError`` if the run has not ended by
        then (the run goes on; call ``stop()`` to end it).
        """
        if self._result is None:
            deadline = None if timeout is None else time.monotonic() + timeout
            try:
                self._pump(deadline)
            except KeyboardInterrupt:
                self._interrupt()
                raise
            except TimeoutError:
                raise  # the run goes on, as documented
            except BaseException:
                # Nothing should get here (display errors are handled in the pump);
                # whatever does, the ranks must not outlive it.
                self._stop_and_drain(RunStatus.STOPPED)
                raise
            self._result = self._build_result()
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

    def _pump(self, deadline: float | None) -> None:
        """Feed events to the display until the run is done (see module contract)."""
        events = self.job.events
        while not self._done:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                self._refresh()
                raise TimeoutError("the run is still going; call stop() to end it")
            # Why a bounded wait: a KeyboardInterrupt can only be raised
            # between bytecodes, and deadline checks need to run.
            wait = POLL
            for limit in (deadline, self._refresh_at):
                if limit is not None:
                    wait = min(wait, max(0.0, limit - now))
            try:
                event = events.get(timeout=wait)
            except queue.Empty:
                pass
            else:
                drained = self._dispatch_batch(event)
                if drained is None:
                    return
                if drained:
                    # Why pause: ranks printing a line per step would otherwise wake
                    # this thread (and take the GIL from the relay) once per line;
                    # letting events gather makes it one wakeup per batch. ``done``
                    # ends the pause early so the end of a run is not delayed.
                    pause = BATCH_PAUSE if deadline is None else min(BATCH_PAUSE, deadline - now)
                    self.job.wait(max(0.0, pause))
            self._refresh()

    def _dispatch_batch(self, event: RunEvent) -> bool | None:
        """Dispatch ``event`` and whatever else is queued (for at most ``BATCH_SECONDS``).

        None once the run is done; True if the queue was emptied; False if
        time ran out first (ranks write faster than this takes it in).
        """
        events = self.job.events
        until = time.monotonic() + BATCH_SECONDS
        while True:
            try:
                if self._dispatch(event):
                    return None
            except Exception as exc:
                self._display_failed(exc)
                continue  # the event it failed on goes to the display that replaced it
            if time.monotonic() >= until:
                return False
            try:
                event = events.get_nowait()
            except queue.Empty:
                return True

    def _dispatch(self, event: RunEvent) -> bool:
        """Hand one event to the display; True if it was the last (``Done``).

        What the display raises propagates (``_dispatch_batch`` handles it) after
        nothing but the display has seen the event: it may be dispatched again."""
        display = self.display
        if isinstance(event, ev.Done):
            if display is not None:
                display.close()
            self._done = True
            return True
        if display is not None:
            if isinstance(event, ev.Output):
                display.output(event.rank, event.stream, event.text)
            elif isinstance(event, ev.StateChanged):
                display.state(event.rank, event.state)
            elif isinstance(event, ev.Metrics):
                rank, metric = event.rank, display.metric
                for row in event.rows:
                    metric(rank, row)
            elif isinstance(event, ev.Notice):
                display.notice(event.text)
        if isinstance(event, ev.Metrics):
            self.metrics.extend(event.rows)
        return False

    def _refresh(self) -> None:
        display = self.display
        if display is None:
            self._refresh_at = None
            return
        try:
            delay = display.refresh()
        except Exception as exc:
            self._display_failed(exc)
            delay = 0.0  # the text display that replaced it may have something to show
        self._refresh_at = None if delay is None else time.monotonic() + delay

    def _display_failed(self, exc: Exception) -> None:
        """Report the display's error once and go on with text, or with no display
        when the text display was what failed (see module contract)."""
        self.display = None
        if self._text_fallback:
            _report(
                f"the text display failed too ({_describe(exc)}); the rest of this run "
                f"is only in its logs, in {self.log_dir}"
            )
            return
        self._text_fallback = True
        text = TextDisplay(ranks=self.job.config.shown_ranks)
        try:
            text.attach(self.log_dir, self._world_size)
            text.notice(
                f"the display failed ({_describe(exc)}); showing the rest of this run as "
                f"text (each rank's log keeps all its output, in {self.log_dir})"
            )
        except Exception as text_exc:
            _report(
                f"the display failed ({_describe(exc)}), and so did the text display "
                f"({_describe(text_exc)}); the run's output is only in {self.log_dir}"
            )
            return
        self.display = text

    def _interrupt(self) -> None:
        # Why ignore SIGINT here: a second Ctrl-C while ranks are being
        # stopped must not leave them running.
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if _main_thread() else None
        try:
            self._stop_and_drain(RunStatus.INTERRUPTED)
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)

    def _stop_and_drain(self, reason: RunStatus) -> None:
        """Stop every rank and take the job's events until it is done (or it is too late)."""
        # The display is left out while stopping: whatever it raises (it may
        # be what was interrupted) must not cut the stop short. The logs keep
        # everything the ranks write meanwhile.
        display, self.display = self.display, None
        try:
            self.job.stop(reason)
            self._pump(time.monotonic() + self.job.config.kill_grace + STOP_WAIT)
        except TimeoutError:
            print("nbddp: some ranks did not stop in time", file=sys.__stderr__)
        except Exception as exc:
            print(f"nbddp: stopping the ranks failed ({_describe(exc)})", file=sys.__stderr__)
        finally:
            self.display = display

    def _build_result(self) -> RunResult:
        job = self.job
        outcomes = job.outcomes()
        values, unloaded = _load_values(outcomes, self.log_dir)
        failure = run_error(job.root_cause, job.status, outcomes, self.log_dir, job.config.timeout)
        release(outcomes)  # the other ranks' exceptions' shared memory: never rebuilt
        return RunResult(
            values=values,
            exit_codes={o.rank: o.exit_code for o in outcomes},
            log_dir=self.log_dir,
            metrics=Metrics(self.metrics),
            failure=failure or unloaded,
            duration=job.elapsed(),
        )


def _load_values(
    outcomes: tuple[RankOutcome, ...], log_dir: Path
) -> tuple[dict[int, Any], ResultError | None]:
    """Each rank's value (an ``UnloadedValue`` where it cannot be rebuilt), and the
    error for rank 0's when that one cannot be (see module contract)."""
    values: dict[int, Any] = {}
    error: ResultError | None = None
    for outcome in outcomes:
        packed = outcome.value
        if packed is None:
            continue
        try:
            values[outcome.rank] = unpack(packed)
        except Exception as exc:
            values[outcome.rank] = UnloadedValue(outcome.rank, packed.type_name, short_error(exc))
            if outcome.rank == 0:
                error = ResultError(
                    f"rank 0's return value ({packed.type_name}) cannot be rebuilt in the "
                    f"notebook: {short_error(exc)}. Return plain data (numbers, strings, "
                    "tensors, arrays, and lists or dicts of them), or make sure its class "
                    "can be imported in the notebook too",
                    rank=0,
                    type_name=packed.type_name,
                    log_path=str(rank_log(log_dir, 0)),
                )
                error.__cause__ = exc
    return values, error


def _describe(exc: BaseException) -> str:
    """``Type: first line of the message`` (cut short), or the type alone."""
    name = type(exc).__name__
    try:
        message = str(exc)
    except Exception:  # its __str__ is broken too: the type still says something
        message = ""
    message = message.strip().split("\n", 1)[0]
    if len(message) > _MAX_ERROR_TEXT:
        message = message[: _MAX_ERROR_TEXT - 1] + "…"
    return f"{name}: {message}" if message else name


def _report(text: str) -> None:
    """One line on stderr, wherever it still works."""
    for stream in (sys.stderr, sys.__stderr__):
        try:
            print(f"nbddp: {text}", file=stream, flush=True)
        except Exception:
            continue
        return


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()
