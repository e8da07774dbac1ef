"""``Run``: the handle of a launch, which shows it while it goes and gives its result.

Contract: ``Run.wait()`` shows the run's output through its display while
it goes on, returns a ``RunResult`` (``launcher.results``) when every rank
has finished and all output has been read, and raises the root-cause
failure otherwise: the earliest failing rank's exception with its original
type when it can be rebuilt here (the rank's traceback attached as the
``__cause__`` and in a note), else ``RemoteError``/``RankExitedError``
(``failures.run_error``). The shared memory of the other ranks' exceptions,
never rebuilt, is closed once the result is built (``failures.release``).
``KeyboardInterrupt`` during ``wait`` stops every rank, waits for them to
be gone, and re-raises. A ``Run`` reads its job only through ``RunSource``:
typed events, rank outcomes, the root cause and the status.

What the display shows is true when ``wait`` returns or raises, on every
path: once the run is over the display learns how each rank ended
(``events.rank_end``: done, failed, exited, stopped, interrupted, timed out,
cancelled by another rank's failure, its own or its collective's; through its ``ended`` when it has
one, else ``state``) and draws its final frame (``close``), also after an
interrupt, a stop, a timeout, or an interrupt that landed while it drew
(it is closed again, with SIGINT ignored).

Background runs: ``watch()`` (``launch(block=False)``) has the display draw
its blocks in the calling cell (its ``pin``, when it has one), then pumps
from a thread of its own, so the blocks stay live while other cells run.
The thread ends with the run, after the final frame; ``wait`` then joins it
(an interrupt meanwhile stops the ranks, and the thread draws their end)
and only returns the result. The thread never asks a prompt: a rank at one
shows as waiting until a cell calls ``wait``, which asks it there.

Display pump: typed events (output chunks, states, metrics) are taken from
the job's queue in the waiting thread, in batches (everything queued, up to
``BATCH_SECONDS`` of work), and handed to the display, which only records
them; between batches the display's ``refresh()`` draws at its own rate and
says when it next needs a call, and the queue wait ends then. So however
fast ranks write, drawing stays bounded, and nothing queued before
``wait`` (``block=False``) is skipped. ``close()`` draws the final state
once every rank's output is complete: before it, a rank that failed only
because another did (``collateral``: its collective broke) is shown as
cancelled by that rank, not failed like the rank that raised. Metric rows
reach ``Run.metrics`` whatever the display does. The entry points give a
display that never raises (``display.guard``); should anything escape the
pump all the same, every rank is stopped before it is raised: a broken
``wait`` never leaves ranks running.

Prompts: a rank waiting for the user (``input()``, ``breakpoint()``, a
post-mortem) is asked for in the waiting thread between batches, one at a
time in the order the ranks asked, by ``asker`` (default: where ``input()``
asks, the prompt naming the rank; the panel sets its own), and its line is
sent back (``RunSource.answer``); a ``KeyboardInterrupt`` at the prompt is
an interrupt like any other. While the ranks are being stopped, prompts
are answered with end of input.
"""

from __future__ import annotations

import collections
import logging
import queue
import signal
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from nbddp.launcher import events as ev
from nbddp.launcher.collateral import collateral
from nbddp.launcher.config import LaunchConfig
from nbddp.launcher.display import Display
from nbddp.launcher.events import (
    Failure,
    RankEnd,
    RankOutcome,
    RankState,
    RunEvent,
    RunStatus,
    rank_end,
)
from nbddp.launcher.failures import release, run_error
from nbddp.launcher.logs import rank_log
from nbddp.launcher.prompts import Asker, ask_rank
from nbddp.launcher.results import Metrics, RunResult, UnloadedValue, load_values
from nbddp.launcher.summary import run_html, run_line

__all__ = ["Run", "RunResult", "RunSource", "RunStatus", "UnloadedValue", "latest_run"]

log = logging.getLogger(__name__)

STOP_WAIT = 30.0  # seconds to wait for ranks to go after a stop, beyond kill_grace
POLL = 0.5  # longest queue wait: KeyboardInterrupt and deadlines are checked between waits
BATCH_SECONDS = 0.05  # longest stretch of event handling before the display may draw
BATCH_PAUSE = 0.05  # after a batch, let events gather this long before taking the next
PROMPT_DRAWS = 3  # refreshes before a prompt, each at most PROMPT_DRAW_WAIT seconds apart
PROMPT_DRAW_WAIT = 0.25


class RunSource(Protocol):
    """What a ``Run`` reads from its job (``launcher.job.Job``): typed values only."""

    events: queue.SimpleQueue[RunEvent]
    log_dir: Path
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

    def answer(self, rank: int, number: int, text: str | None) -> None:
        """Send ``rank`` the user's line for its prompt ``number``."""


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

    ``wait()`` shows the output until every rank has finished, then returns a
    ``RunResult`` or raises the root-cause failure (the earliest failing rank's
    own exception when it can be rebuilt here, else ``RemoteError`` or
    ``RankExitedError``); Ctrl-C in ``wait()`` stops every rank. ``stop()``,
    ``dump_stacks()``, ``status``, ``rank_states()``, ``pids`` and
    ``output(rank)`` work while it runs (see module contract).
    """

    def __init__(self, job: RunSource, display: Display | None, config: LaunchConfig) -> None:
        global _LATEST, _LATEST_LOGS
        self.job = job
        self._config = config
        self.display = display
        self.metrics = Metrics()
        """Rows sent with ``nbddp.log`` so far, in arrival order (``metrics.to_pandas()``)."""
        self._result: RunResult | None = None
        self._refresh_at: float | None = None  # when the display next wants a refresh
        self._done = False  # the job's last event (``Done``) was taken from its queue
        self._asked: collections.deque[ev.InputAsked] = collections.deque()
        self.asker: Asker = ask_rank
        """Asks the user for a waiting rank's line (see module contract)."""
        self._prompting = True  # False while the ranks are being stopped
        self._watcher: threading.Thread | None = None  # pumps a background run (``watch``)
        self._watch_error: BaseException | None = None  # what broke the watcher, if anything
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
        """True once every rank has exited, all output has been read and a background
        run's last frame is drawn; waits up to ``timeout`` seconds for that (None: as
        long as it takes), showing nothing itself."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self.job.wait(timeout):
            return False
        watcher = self._watcher
        if self._watching(watcher):
            assert watcher is not None
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
        return f"<nbddp Run {self._line()}>"

    def _repr_html_(self) -> str:
        """The same line in a notebook, with where the logs are."""
        return run_html(self._line(), self.log_dir)

    def _line(self) -> str:
        states = [o.state for o in self.job.outcomes()]
        return run_line(self.run_id, self.status, states, self.elapsed)

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
        """Show output until the run ends; return its result or raise its failure.

        With ``timeout``, raise ``TimeoutError`` if the run has not ended by
        then (the run goes on; call ``stop()`` to end it).
        """
        if self._result is None:
            deadline = None if timeout is None else time.monotonic() + timeout
            try:
                self._follow(deadline)
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

    def watch(self) -> None:
        """Show the run live from a thread of its own until it ends (see module
        contract); returns at once. Nothing happens if it is already watched or over."""
        if self._watcher is not None or self._done:
            return
        try:
            pin = getattr(self.display, "pin", None)
            if pin is not None:
                pin()
            self._watcher = threading.Thread(
                target=self._watch, name=f"nbddp-run-{self.run_id}", daemon=True
            )
            self._watcher.start()
        except KeyboardInterrupt:
            self._interrupt()
            raise
        except BaseException:
            self._stop_and_drain(RunStatus.STOPPED)
            raise

    def _watch(self) -> None:
        """The watcher thread: pump until the run is done (the display's final frame
        included); whatever breaks it stops every rank first."""
        try:
            self._pump(None)
        except BaseException as exc:
            log.exception("nbddp: showing run %s failed; stopping its ranks", self.run_id)
            self._watch_error = exc
            # A KeyboardInterrupt is an interrupt, whichever thread it reached.
            interrupted = isinstance(exc, KeyboardInterrupt)
            try:
                self._stop_and_drain(RunStatus.INTERRUPTED if interrupted else RunStatus.STOPPED)
            except BaseException:  # nothing is left to raise it to; wait() drains again
                log.exception("nbddp: stopping the ranks of run %s failed", self.run_id)

    def _watching(self, watcher: threading.Thread | None) -> bool:
        """True if ``watcher`` is another thread, started and not ended: it pumps, this
        one must not."""
        return (
            watcher is not None
            and watcher is not threading.current_thread()
            and watcher.ident is not None
            and watcher.is_alive()
        )

    def _follow(self, deadline: float | None) -> None:
        """Until the run is done: join the watcher when there is one, else pump here."""
        watcher = self._watcher
        if self._watching(watcher):
            assert watcher is not None
            while watcher.is_alive():
                if self._asked:
                    self._serve_prompts(draw=False)  # the watcher draws; this thread asks
                # Why bounded joins: a KeyboardInterrupt is only raised between them.
                wait = POLL if deadline is None else min(POLL, deadline - time.monotonic())
                if wait <= 0:
                    raise TimeoutError("the run is still going; call stop() to end it")
                watcher.join(min(wait, PROMPT_DRAW_WAIT))  # a prompt waits no longer
        error, self._watch_error = self._watch_error, None
        if error is not None:
            raise error  # once: a later wait() gives the run's own result or error
        if not self._done:
            self._pump(deadline)

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
                    self._pause(pause)
            self._refresh()
            if self._asked and not (self._prompting and self._in_watcher()):
                self._serve_prompts()

    def _pause(self, seconds: float) -> None:
        if not self._asked:
            self.job.wait(max(0.0, seconds))

    def _serve_prompts(self, draw: bool = True) -> None:
        """Ask the user for each waiting rank's line, in order (see module contract);
        ``draw``: let the display draw first (not while the watcher draws)."""
        while self._asked:
            asked = self._asked.popleft()
            text = None
            if self._prompting:
                if draw:
                    self._draw_before_prompt()
                text = self.asker(asked.rank, asked.prompt, asked.password)
            self.job.answer(asked.rank, asked.number, text)

    def _in_watcher(self) -> bool:
        """True in the watcher thread: it never asks (only answers end of input while
        the ranks are being stopped), as its ``input()`` would land in whatever cell
        runs then, or nowhere; the thread in ``wait`` asks."""
        return self._watcher is threading.current_thread()

    def _draw_before_prompt(self) -> None:
        """Let the display draw what is pending (the rank's state, what pdb printed)
        before the prompt holds this thread: within its rate limit, so a short wait."""
        display = self.display
        if display is None:
            return
        for _ in range(PROMPT_DRAWS):
            delay = display.refresh()
            if delay is None or delay > PROMPT_DRAW_WAIT:
                return
            self.job.wait(delay)

    def _dispatch_batch(self, event: RunEvent) -> bool | None:
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

    def _dispatch(self, event: RunEvent) -> bool:
        """Hand one event to the display; True if it was the last (``Done``)."""
        display = self.display
        if isinstance(event, ev.MetricRows):
            self.metrics.extend(event.rows)  # first: whatever the display does next
        if isinstance(event, ev.Done):
            self._done = True
            if display is not None:
                self._show_ends(display)
                display.close()
            return True
        if display is not None:
            if isinstance(event, ev.Text):
                display.output(event.rank, event.stream, event.text)
            elif isinstance(event, ev.StateChanged):
                display.state(event.rank, event.state)
            elif isinstance(event, ev.MetricRows):
                rank, metric = event.rank, display.metric
                for row in event.rows:
                    metric(rank, row)
            elif isinstance(event, ev.Notice):
                display.notice(event.text)
        if isinstance(event, ev.InputAsked):
            self._asked.append(event)
        return False

    def _show_ends(self, display: Display) -> None:
        """Tell ``display`` how each rank ended (the run is over)."""
        job = self.job
        status, root = job.status, job.root_cause
        ended = getattr(display, "ended", None)
        for outcome in job.outcomes():
            # A rank whose collective broke because another failed was stopped by it.
            stopped_by = root is not None and collateral(outcome, root) is not None
            end: RankEnd = rank_end(outcome, status, root, stopped_by=stopped_by)
            if ended is not None:
                ended(end)
            else:
                display.state(end.rank, end.state)

    def _refresh(self) -> None:
        display = self.display
        if display is None:
            self._refresh_at = None
            return
        delay = display.refresh()
        self._refresh_at = None if delay is None else time.monotonic() + delay

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
        """Stop every rank and take the job's events until it is done (or it is too
        late), showing them: the display draws the final frame. Prompts asked
        meanwhile are answered with end of input."""
        grace = self._config.job.kill_grace + STOP_WAIT
        self._prompting = False
        try:
            self.job.stop(reason)
        except Exception:
            log.exception("nbddp: stopping the ranks of run %s failed", self.run_id)
        try:
            self._finish_stopping(grace)
        finally:
            self._prompting = True

    def _finish_stopping(self, grace: float) -> None:
        """Take the job's events (or let the watcher take them) for up to ``grace``
        seconds, then draw what is true now, over or not."""
        watcher = self._watcher
        if self._watching(watcher):
            assert watcher is not None
            watcher.join(grace)  # it takes the events, and draws the end
            if watcher.is_alive():
                log.warning("nbddp: run %s did not end in %gs", self.run_id, grace)
            return
        display = self.display
        try:
            self._drain(time.monotonic() + grace)
        except TimeoutError:
            log.warning("nbddp: some ranks of run %s did not stop in time", self.run_id)
        if not self._done and self.display is not None:
            # Not over, but what it shows must be true: the states as they are now.
            self._quietly(self.display.close)
        self.display = display

    def _drain(self, deadline: float) -> None:
        """Pump until the run is done; a display that raises (it may be what was
        interrupted) is dropped, never allowed to cut the stop short. The logs keep
        everything the ranks write meanwhile."""
        while True:
            try:
                self._pump(deadline)
                return
            except TimeoutError:
                raise
            except Exception:
                if self.display is None:
                    raise
                log.exception("nbddp: the display of run %s failed while stopping", self.run_id)
                self.display = None

    def _quietly(self, call: Callable[[], object]) -> None:
        try:
            call()
        except Exception:
            log.exception("nbddp: the display of run %s failed", self.run_id)

    def _build_result(self) -> RunResult:
        job = self.job
        outcomes = job.outcomes()
        values, unloaded = load_values(outcomes, self.log_dir)
        timeout = self._config.job.timeout
        failure = run_error(job.root_cause, job.status, outcomes, self.log_dir, timeout)
        release(outcomes)  # the other ranks' exceptions' shared memory: never rebuilt
        return RunResult(
            values=values,
            exit_codes={o.rank: o.exit_code for o in outcomes},
            log_dir=self.log_dir,
            metrics=Metrics(self.metrics),
            failure=failure or unloaded,
            duration=job.elapsed(),
        )


def read_rank_log(log_dir: Path, rank: int, world_size: int, tail: int | None = None) -> str:
    """The text of ``rank``'s log in ``log_dir`` (all of it, or its last ``tail``
    lines; empty before the rank wrote anything). ``ValueError`` for a rank
    outside ``0 .. world_size - 1`` or a ``tail`` below 0, saying which."""
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank={rank!r}: this run's ranks are 0 to {world_size - 1}")
    if tail is not None and (isinstance(tail, bool) or not isinstance(tail, int) or tail < 0):
        raise ValueError(f"tail={tail!r}: give a number of lines (0 or more), or None")
    path = rank_log(log_dir, rank)
    try:
        data = path.read_bytes() if tail is None else last_lines(path, tail)
    except FileNotFoundError:
        return ""
    return data.decode("utf-8", "replace")


def last_lines(path: Path, count: int, block: int = 1 << 16) -> bytes:
    """The last ``count`` lines of the file ``path`` (a line: up to and with its
    newline; the last may have none), read from its end."""
    if count == 0:
        return b""
    with path.open("rb") as file:
        end = file.seek(0, 2)
        start, data = end, b""
        # count + 1 newlines: the one before the first line kept marks its start.
        while start > 0 and data.count(b"\n", 0, len(data) - 1) < count:
            start = max(0, start - block)
            file.seek(start)
            data = file.read(end - start)
    cut = len(data) - 1 if data.endswith(b"\n") else len(data)
    for _ in range(count):
        cut = data.rfind(b"\n", 0, cut)
        if cut < 0:
            return data
    return data[cut + 1 :]


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()
