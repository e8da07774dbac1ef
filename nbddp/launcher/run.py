"""``Run`` (the handle of a launch) and ``RunResult`` (what it produced).

Contract: ``Run.wait()`` shows the run's output through its display while
it goes on, returns a ``RunResult`` when every rank has finished and all
output has been read, and raises the root-cause failure otherwise: the
earliest failing rank's exception with its original type when it can be
rebuilt here (the rank's traceback attached as the ``__cause__`` and in a
note), else ``WorkerError``/``RankExitedError``. ``KeyboardInterrupt``
during ``wait`` stops every rank, waits for them to be gone, and re-raises.

Display pump: events (output chunks, states, metrics) are taken from the
job's queue in the waiting thread, in batches (everything queued, up to
``BATCH_SECONDS`` of work), and handed to the display, which only records
them; between batches the display's ``refresh()`` draws at its own rate and
says when it next needs a call, and the queue wait ends then. So however
fast ranks write, drawing stays bounded, and nothing queued before
``wait`` (``block=False``) is skipped. ``close()`` draws the final state
once every rank's output is complete.
"""

from __future__ import annotations

import pickle
import queue
import signal
import sys
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cloudpickle

from nbddp.display.protocol import Display
from nbddp.errors import LaunchTimeout, RankError, RankExitedError, RemoteTraceback, WorkerError
from nbddp.launcher.job import Failure, Job
from nbddp.launcher.metrics import Metrics

STOP_WAIT = 30.0  # seconds to wait for ranks to go after a stop, beyond kill_grace
POLL = 0.5  # longest queue wait: KeyboardInterrupt and deadlines are checked between waits
BATCH_SECONDS = 0.05  # longest stretch of event handling before the display may draw
BATCH_PAUSE = 0.05  # after a batch, let events gather this long before taking the next


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
        return self.log_dir / f"rank{rank}.log"


_LATEST: weakref.ref[Run] | None = None


def latest_run() -> Run | None:
    """The most recently started run in this process, from any entry point, if alive."""
    return _LATEST() if _LATEST is not None else None


class Run:
    """A launched run (see module contract)."""

    def __init__(self, job: Job, display: Display | None) -> None:
        global _LATEST
        self.job = job
        self.display = display
        self.metrics = Metrics()
        """Rows sent with ``nbddp.log`` so far, in arrival order (``metrics.to_pandas()``)."""
        self._result: RunResult | None = None
        self._refresh_at: float | None = None  # when the display next wants a refresh
        if display is not None:
            display.attach(job.log_dir, len(job.ranks))
        _LATEST = weakref.ref(self)

    @property
    def log_dir(self) -> Path:
        """The run's log directory."""
        return self.job.log_dir

    @property
    def status(self) -> str:
        """starting, running, done, failed, stopped, timeout or interrupted."""
        job = self.job
        if not job.done.is_set():
            return "running" if any(s.state != "starting" for s in job.ranks) else "starting"
        if job.failure is not None and job.stop_reason in (None, "failed"):
            return "failed"
        return job.stop_reason or "done"

    @property
    def pids(self) -> dict[int, int]:
        """Rank -> pid."""
        return self.job.pids()

    def rank_states(self) -> dict[int, str]:
        """Rank -> starting, running, done, failed or stopped."""
        return {s.rank: s.state for s in self.job.ranks}

    def output(self, rank: int) -> str:
        """Everything ``rank`` wrote so far (stdout and stderr, as they arrived)."""
        try:
            return (self.log_dir / f"rank{rank}.log").read_bytes().decode("utf-8", "replace")
        except FileNotFoundError:
            return ""

    def stop(self) -> None:
        """Stop every rank; returns at once (``wait()`` to wait for them)."""
        self.job.stop("stopped")

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
        while True:
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
                    self.job.done.wait(max(0.0, pause))
            self._refresh()

    def _dispatch_batch(self, event: tuple[Any, ...]) -> bool | None:
        """Dispatch ``event`` and whatever else is queued (for at most ``BATCH_SECONDS``).

        None once the run is done; True if the queue was emptied; False if
        time ran out first (ranks write faster than this takes it in).
        """
        events = self.job.events
        until = time.monotonic() + BATCH_SECONDS
        while True:
            if self._dispatch(event):
                return None
            if time.monotonic() >= until:
                return False
            try:
                event = events.get_nowait()
            except queue.Empty:
                return True

    def _dispatch(self, event: tuple[Any, ...]) -> bool:
        """Hand one event to the display; True if it was the last ("done")."""
        kind = event[0]
        if kind == "done":
            if self.display is not None:
                self.display.close()
            return True
        if kind == "metrics":
            self.metrics.extend(event[2])
        display = self.display
        if display is None:
            return False
        if kind == "output":
            display.output(event[1], event[2], event[3])
        elif kind == "state":
            display.state(event[1], event[2])
        elif kind == "metrics":
            rank, metric = event[1], display.metric
            for row in event[2]:
                metric(rank, row)
        elif kind == "notice":
            display.notice(event[1])
        return False

    def _refresh(self) -> None:
        if self.display is None:
            return
        delay = self.display.refresh()
        self._refresh_at = None if delay is None else time.monotonic() + delay

    def _interrupt(self) -> None:
        # Why ignore SIGINT here: a second Ctrl-C while ranks are being
        # stopped must not leave them running.
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if _main_thread() else None
        # The display is left out while stopping: whatever it raises (it may
        # be what was interrupted) must not cut the stop short. The logs keep
        # everything the ranks write meanwhile.
        display, self.display = self.display, None
        try:
            self.job.stop("interrupted")
            self._pump(time.monotonic() + self.job.config.kill_grace + STOP_WAIT)
        except TimeoutError:
            print("nbddp: some ranks did not stop in time", file=sys.__stderr__)
        finally:
            self.display = display
            if previous is not None:
                signal.signal(signal.SIGINT, previous)

    def _build_result(self) -> RunResult:
        job = self.job
        values: dict[int, Any] = {}
        for state in job.ranks:
            data = state.value
            if data is not None:
                values[state.rank] = cloudpickle.loads(data)
        failure: BaseException | None = None
        if job.failure is not None:
            failure = build_error(job.failure, job.ranks[job.failure.rank].exit_code, self.log_dir)
        elif job.stop_reason == "timeout":
            stuck = [s.rank for s in job.ranks if s.value is None]
            failure = LaunchTimeout(
                f"the run exceeded its timeout of {job.config.timeout:g}s and was stopped "
                f"with rank{'s' if len(stuck) > 1 else ''} {', '.join(map(str, stuck))} "
                f"still running; each one's stacks are at the end of its log in {self.log_dir}"
            )
        elif job.stop_reason is not None and len(values) < len(job.ranks):
            failure = RankError(f"the run was {job.stop_reason}", rank=-1)
        end = job.ended_at or time.monotonic()
        return RunResult(
            values=values,
            exit_codes={s.rank: s.exit_code for s in job.ranks},
            log_dir=self.log_dir,
            metrics=Metrics(self.metrics),
            failure=failure,
            duration=end - job.started_at,
        )


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def describe_exit(code: int | None) -> str:
    """ "exit code 3", "signal SIGSEGV (Segmentation fault)", or "an unknown status"."""
    if code is None:
        return "an unknown status (its exit code was lost)"
    if code >= 0:
        return f"exit code {code}"
    try:
        sig = signal.Signals(-code)
    except ValueError:
        return f"signal {-code}"
    return f"signal {sig.name} ({signal.strsignal(sig) or sig.name})"


def build_error(failure: Failure, exit_code: int | None, log_dir: Path) -> BaseException:
    """The exception to raise in the notebook for a run's root-cause failure."""
    rank = failure.rank
    log = str(log_dir / f"rank{rank}.log")
    info = failure.error
    if info is None:
        what = describe_exit(exit_code)
        verb = "was killed by" if exit_code is not None and exit_code < 0 else "ended with"
        return RankExitedError(
            f"rank {rank} {verb} {what} before returning; its output is in {log}",
            rank=rank,
            exit_code=exit_code,
            log_path=log,
        )
    exc: BaseException | None = None
    if info.exc_bytes is not None:
        try:
            exc = pickle.loads(info.exc_bytes)
        except Exception:
            exc = None
    if exc is None:
        exc = WorkerError(
            f"rank {rank} raised {info.type_name}: {info.message}",
            rank=rank,
            remote_type=info.type_name,
            remote_traceback=info.traceback,
            log_path=log,
        )
    exc.__cause__ = RemoteTraceback(f"\n--- traceback from rank {rank} ---\n{info.traceback}")
    if hasattr(exc, "add_note"):  # Python 3.11+
        exc.add_note(f"(raised on rank {rank}; full output in {log})")
    return exc
