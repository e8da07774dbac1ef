"""The pump: what shows a run while it goes, in the waiting thread or a watcher of its own.

Contract: ``Pump(run)`` hands the run's events to ``run.display`` in batches (up to
``BATCH_SECONDS`` of work), which only records them and draws on ``refresh()``; metric rows reach
``run.metrics`` whatever the display does. Prompts from ranks are asked (``run.asker``) one at a
time in the thread that waits, never in the watcher (``watch``, for ``block=False``): a prompt hands
the pumping to a watcher, so the run goes on while the user answers; a prompt whose rank or run
ended is withdrawn (``run.withdraw``). ``stop_and_drain`` stops every rank and pumps until the run
is done, answering prompts with end of input; a display that raises meanwhile is dropped.
"""

from __future__ import annotations

import collections
import logging
import queue
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from nbddp.launcher import events as ev
from nbddp.launcher.events import Failure, RankEnd, RankOutcome, RunEvent, RunStatus, rank_end
from nbddp.launcher.failures import collateral
from nbddp.launcher.prompts import Asker, prompt_for
from nbddp.launcher.results import Metrics
from nbddp.wire.protocol import Answer, MetricRow

if TYPE_CHECKING:
    from nbddp.launcher.config import LaunchConfig

log = logging.getLogger(__name__)

STOP_WAIT = 30.0  # seconds to wait for ranks to go after a stop, beyond kill_grace
POLL = 0.5  # longest queue wait: KeyboardInterrupt and deadlines are checked between waits
BATCH_SECONDS = 0.05  # longest stretch of event handling before the display may draw
BATCH_PAUSE = 0.05  # after a batch, let events gather this long before taking the next
PROMPT_DRAWS = 3  # refreshes before a prompt, each at most PROMPT_DRAW_WAIT seconds apart
PROMPT_DRAW_WAIT = 0.25


class Display(Protocol):
    """What a run's display implements (text, kernel blocks, the panel), fed by ``Run.wait``:
    ``attach`` once, then the event methods (cheap: they record) on the thread that waits,
    ``refresh`` between batches, ``close`` at the end."""

    def attach(self, log_dir: Path, world_size: int) -> None:
        """The run's log directory and rank count, before any event."""

    def output(self, rank: int, stream: str, text: str) -> None:
        """A chunk of decoded text ``rank`` wrote to ``stream`` (stdout or stderr)."""

    def notice(self, text: str) -> None:
        """A message from nbddp itself."""

    def state(self, rank: int, state: str) -> None:
        """``rank`` is now running, done, failed or stopped."""

    def metric(self, rank: int, row: MetricRow) -> None:
        """A row ``rank`` sent with ``nbddp.log``."""

    def refresh(self) -> float | None:
        """Draw what is due; return seconds until another call is useful (None: no need)."""

    def close(self) -> None:
        """The run's output is complete: draw everything that is left."""


class RunSource(Protocol):
    """What a ``Run`` reads of its run: typed values only (the contracts: ``core.RunCore``)."""

    events: queue.SimpleQueue[RunEvent]
    log_dir: Path
    run_id: str

    @property
    def root_cause(self) -> Failure | None: ...
    @property
    def status(self) -> RunStatus: ...
    def outcomes(self) -> tuple[RankOutcome, ...]: ...
    def wait(self, timeout: float | None = None) -> bool: ...
    def elapsed(self) -> float: ...
    def pids(self) -> dict[int, int]: ...
    def stop(self, reason: RunStatus = RunStatus.STOPPED) -> None: ...
    def dump_stacks(self) -> None: ...
    def answer(self, rank: int, number: int, text: Answer) -> None: ...


class Shown(Protocol):
    """What the pump reads of the run it shows (``run.Run``)."""

    job: RunSource
    display: Display | None
    metrics: Metrics
    asker: Asker
    withdraw: Callable[[threading.Thread], None]

    @property
    def run_id(self) -> str: ...
    @property
    def config(self) -> LaunchConfig: ...
    def redraw(self) -> None: ...


class Pump:
    """Shows one run."""

    @property
    def run(self) -> Shown:
        """The run shown (alive while it is shown: its caller or watcher holds it)."""
        run = self._run()
        assert run is not None
        return run

    def __init__(self, run: Shown) -> None:
        # Weak: the run holds its pump, and a cycle would keep a finished run's memory
        # until the garbage collector runs; a watcher thread holds the run itself.
        self._run = weakref.ref(run)
        self._refresh_at: float | None = None  # when the display next wants a refresh
        self.done = False  # the job's last event (``Done``) was taken from its queue
        self._asked: collections.deque[ev.InputAsked] = collections.deque()
        self._prompting = True  # False while the ranks are being stopped
        self._ended: set[int] = set()  # ranks whose prompts nobody needs answered
        self._asking: tuple[ev.InputAsked, threading.Thread] | None = None  # the user has it
        self._withdrawn = False  # the prompt the user has was withdrawn
        self._ask_lock = threading.Lock()
        self.watcher: threading.Thread | None = None  # pumps a background run (``watch``)
        self._watch_error: BaseException | None = None  # what broke the watcher, if anything

    def watch(self) -> None:
        """Show the run live from a thread of its own until it ends; returns at once.
        Nothing happens if it is already watched or over."""
        if self.watcher is not None or self.done:
            return
        try:
            pin = getattr(self.run.display, "pin", None)
            if pin is not None:
                pin()
            self.watcher = threading.Thread(
                target=self._watch,
                args=(self.run,),
                name=f"nbddp-run-{self.run.run_id}",
                daemon=True,
            )
            self.watcher.start()
        except KeyboardInterrupt:
            self.interrupt()
            raise
        except BaseException:
            self.stop_and_drain(RunStatus.STOPPED)
            raise

    def _watch(self, run: Shown) -> None:
        """The watcher thread: pump until the run is done (the display's final frame
        included); whatever breaks it stops every rank first."""
        try:
            self._pump(None)
        except BaseException as exc:
            log.exception("nbddp: showing run %s failed; stopping its ranks", self.run.run_id)
            self._watch_error = exc
            # A KeyboardInterrupt is an interrupt, whichever thread it reached.
            interrupted = isinstance(exc, KeyboardInterrupt)
            try:
                self.stop_and_drain(RunStatus.INTERRUPTED if interrupted else RunStatus.STOPPED)
            except BaseException:  # nothing is left to raise it to; wait() drains again
                log.exception("nbddp: stopping the ranks of run %s failed", self.run.run_id)

    def watching(self) -> threading.Thread | None:
        """The watcher when it is another thread, started and not ended: it pumps, this
        one must not."""
        watcher = self.watcher
        if watcher is None or watcher is threading.current_thread() or watcher.ident is None:
            return None
        return watcher if watcher.is_alive() else None

    def follow(self, deadline: float | None) -> None:
        """Until the run is done: join the watcher when there is one, asking its prompts,
        else pump here (until a prompt hands the pumping to a watcher)."""
        while True:
            if (watcher := self.watching()) is not None:
                while watcher.is_alive():
                    if self._asked:
                        self._serve_prompts()
                    # Why bounded joins: a KeyboardInterrupt is only raised between them.
                    wait = POLL if deadline is None else min(POLL, deadline - time.monotonic())
                    if wait <= 0:
                        raise TimeoutError("the run is still going; call stop() to end it")
                    watcher.join(min(wait, PROMPT_DRAW_WAIT))  # a prompt waits no longer
            error, self._watch_error = self._watch_error, None
            if error is not None:
                raise error  # once: a later wait() gives the run's own result or error
            if self.done:
                return
            self._pump(deadline)

    def _pump(self, deadline: float | None) -> None:
        """Feed events to the display until the run is done."""
        events = self.run.job.events
        while not self.done:
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
                if drained and not self._asked:
                    # Why pause: ranks printing a line per step would otherwise wake
                    # this thread (and take the GIL from the relay) once per line;
                    # letting events gather makes it one wakeup per batch. ``done``
                    # ends the pause early so the end of a run is not delayed.
                    pause = BATCH_PAUSE if deadline is None else min(BATCH_PAUSE, deadline - now)
                    self.run.job.wait(max(0.0, pause))
            self._refresh()
            if self._asked and not self._prompting:
                self._serve_prompts()  # end of input for each: the ranks are being stopped
            elif self._asked and self.watcher is None:
                # The watcher pumps from now on and this thread asks (``follow``): its
                # input() belongs to this cell, and the run goes on while the user answers.
                self._draw_before_prompt()
                self.watch()
                return

    def _serve_prompts(self) -> None:
        """Ask the user for each waiting rank's line, in order (end of input while the
        ranks are being stopped); none for a rank that ended."""
        while self._asked:
            asked = self._asked.popleft()
            if self.done or asked.rank in self._ended:
                continue  # nobody waits for this answer
            if not self._prompting:
                self.run.job.answer(asked.rank, asked.number, None)
                continue
            with self._ask_lock:
                self._asking, self._withdrawn = (asked, threading.current_thread()), False
            try:
                try:
                    text = self.run.asker(asked.rank, asked.prompt, asked.password)
                finally:
                    with self._ask_lock:
                        self._asking = None
            except KeyboardInterrupt:
                if not self._withdrawn:
                    raise  # the user's own interrupt
            if self._withdrawn:
                said = "no longer asks: it ended, so its prompt takes no answer"
                self._say(prompt_for(asked.rank, "") + said)
            else:
                self.run.job.answer(asked.rank, asked.number, text)

    def _withdraw(self, rank: int | None) -> None:
        """``rank`` ended (None: the run did): end the user's prompt if it is that rank's
        (any, for None). Whatever thread pumps calls this; the asking thread is another."""
        with self._ask_lock:
            if self._asking is None or self._withdrawn:
                return
            asked, thread = self._asking
            if rank is None or asked.rank == rank:
                self._withdrawn = True
                self.run.withdraw(thread)

    def _say(self, text: str) -> None:
        """A line of nbddp's in the run's display while it is live, else in the cell."""
        display = self.run.display
        if display is not None and not self.done:
            display.notice(text)
        else:
            print(f"nbddp: {text}", file=sys.stderr)

    def _draw_before_prompt(self) -> None:
        """Let the display draw what is pending (the rank's state, what pdb printed)
        before the prompt holds this thread: within its rate limit, so a short wait."""
        display = self.run.display
        if display is None:
            return
        for _ in range(PROMPT_DRAWS):
            delay = display.refresh()
            if delay is None or delay > PROMPT_DRAW_WAIT:
                return
            self.run.job.wait(delay)

    def _dispatch_batch(self, event: RunEvent) -> bool | None:
        """Dispatch ``event`` and whatever else is queued, for at most ``BATCH_SECONDS``: None
        once the run is done, True if the queue was emptied, False if time ran out first."""
        events = self.run.job.events
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
        display = self.run.display
        if isinstance(event, ev.Done):
            self.done = True
            self._withdraw(None)
            if display is not None:
                self._show_ends(display)
                display.close()
            self._quietly(self.run.redraw)
            return True
        if display is not None:
            if isinstance(event, ev.Text):
                display.output(event.rank, event.stream, event.text)
            elif isinstance(event, ev.StateChanged):
                display.state(event.rank, event.state)
            elif isinstance(event, ev.Notice):
                display.notice(event.text)
        if isinstance(event, ev.MetricRows):
            self.run.metrics.extend(event.rows)  # first: whatever the display does next
            if display is not None:
                rank, metric = event.rank, display.metric
                for row in event.rows:
                    metric(rank, row)
        elif isinstance(event, ev.InputAsked):
            self._asked.append(event)
        elif isinstance(event, ev.StateChanged) and event.state.ended:
            self._ended.add(event.rank)
            self._withdraw(event.rank)
        return False

    def _show_ends(self, display: Display) -> None:
        """Tell ``display`` how each rank ended (the run is over)."""
        job = self.run.job
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
        self._quietly(self.run.redraw)
        display = self.run.display
        delay = display.refresh() if display is not None else None
        self._refresh_at = None if delay is None else time.monotonic() + delay

    def interrupt(self) -> None:
        # Why ignore SIGINT here: a second Ctrl-C while ranks are being
        # stopped must not leave them running.
        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
        try:
            self.stop_and_drain(RunStatus.INTERRUPTED)
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)

    def stop_and_drain(self, reason: RunStatus) -> None:
        """Stop every rank and show the job's events until it is done (or too late): the display
        draws the final frame; prompts asked meanwhile are answered with end of input."""
        grace = self.run.config.job.kill_grace + STOP_WAIT
        self._prompting = False
        try:
            self.run.job.stop(reason)
        except Exception:
            log.exception("nbddp: stopping the ranks of run %s failed", self.run.run_id)
        try:
            self._finish_stopping(grace)
        finally:
            self._prompting = True

    def _finish_stopping(self, grace: float) -> None:
        """Take the job's events (or let the watcher take them) for up to ``grace``
        seconds, then draw what is true now, over or not."""
        if (watcher := self.watching()) is not None:
            watcher.join(grace)  # it takes the events, and draws the end
            if watcher.is_alive():
                log.warning("nbddp: run %s did not end in %gs", self.run.run_id, grace)
            return
        display = self.run.display
        try:
            self._drain(time.monotonic() + grace)
        except TimeoutError:
            log.warning("nbddp: some ranks of run %s did not stop in time", self.run.run_id)
        if not self.done and self.run.display is not None:
            # Not over, but what it shows must be true: the states as they are now.
            self._quietly(self.run.display.close)
        self.run.display = display

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
                if self.run.display is None:
                    raise
                log.exception("nbddp: the display of run %s failed while stopping", self.run.run_id)
                self.run.display = None

    def _quietly(self, call: Callable[[], object]) -> None:
        try:
            call()
        except Exception:
            log.exception("nbddp: the display of run %s failed", self.run.run_id)
