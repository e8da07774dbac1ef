"""The run core: one run's bookkeeping, whatever carries its ranks.

Contract: a transport (``job.Job`` on this machine, ``cluster.client.ClusterJob`` across nodes)
holds one ``RunCore`` and tells it what its ranks did, on the relay loop thread only: ``route`` an
event, ``fail``, ``end``. Other threads read typed values (``events``, ``outcomes()``,
``root_cause``, ``status``, ``elapsed()``, ``wait``) and ask through ``stop``, ``dump_stacks`` and
``answer``, which the core hands to its transport on the loop. A ``Listener`` (a session's cells, an
agent's forwarder) takes the events, rank messages and the end instead of ``events``. Once the run
has ended the core holds only typed values: timers cancelled, transport and listener let go.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from threading import Event
from typing import Protocol

import psutil

from nbddp.launcher.events import (
    Done,
    Failure,
    Notice,
    RankOutcome,
    RankState,
    RunEvent,
    RunStatus,
    StacksTaken,
    StateChanged,
)
from nbddp.launcher.failures import root_cause
from nbddp.launcher.logs import new_run_dir
from nbddp.launcher.prompts import WaitClock
from nbddp.launcher.relay import loop
from nbddp.wire.descriptors import Packed
from nbddp.wire.protocol import Answer, Body, ErrorInfo

STACKS_WAIT = 1.0  # seconds a rank gets to answer for its stacks before the signal
STACKS_SIGNAL_WAIT = 0.5  # seconds faulthandler gets to write a signalled dump


@dataclass
class RankRecord:
    """What the notebook knows about one rank. Written on the relay loop only."""

    rank: int
    pid: int | None = None
    state: RankState = RankState.STARTING
    exit_code: int | None = None
    exited: bool = False
    closed: bool = False
    value: Packed | None = None
    error: ErrorInfo | None = None
    exit_request: int | None = None
    stacks: StacksTaken | None = None
    started_at: float = field(default_factory=time.monotonic)
    ended_at: float | None = None

    def outcome(self) -> RankOutcome:
        """A frozen copy, for other threads."""
        return RankOutcome(**{f.name: getattr(self, f.name) for f in fields(RankOutcome)})

    def signal(self, sig: int) -> bool:
        """Signal the rank's group, and its live descendants while it lives (a reaped pid
        may be another's); True if any process was there. Nothing once its pipes are
        closed: its group id may since be someone else's."""
        if self.pid is None or self.closed:
            return False
        alive = False
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)
            alive = True
        if self.exited:
            return alive
        if not alive:  # just forked: it has not made its own group yet
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.pid, sig)
                alive = True
        # Descendants that left the group (setsid) are still found through the tree.
        with contextlib.suppress(psutil.Error):
            for proc in psutil.Process(self.pid).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    proc.send_signal(sig)
                    alive = True
        return alive


class Transport(Protocol):
    """What carries a run's ranks; every method runs on the loop thread."""

    def stop_ranks(self, reason: RunStatus) -> None:
        """Stop every rank (SIGTERM, then SIGKILL after the grace)."""

    def ask_stacks(self, ranks: Iterable[int]) -> list[int]:
        """Ask ``ranks`` to write their stacks; the ranks asked."""

    def answer(self, rank: int, number: int, text: Answer) -> None:
        """Send ``rank`` the user's line for its prompt ``number``."""

    def release(self) -> None:
        """The run has ended: let go of what only a running run needs."""


class Listener(Protocol):
    """Takes a run's events in place of its queue (loop thread)."""

    def route(self, event: RunEvent) -> None: ...
    def message(self, rank: int, kind: str, body: Body) -> None: ...
    def ending(self) -> None: ...


class RunCore:
    """One run's bookkeeping."""

    def __init__(self, ranks: int, failure_grace: float) -> None:
        self.run_id = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]  # + 6 random hex
        self._run_dir = new_run_dir(self.run_id)  # locked until the run ends; old runs pruned
        self.log_dir = self._run_dir.path
        self.events: queue.SimpleQueue[RunEvent] = queue.SimpleQueue()
        self.records = [RankRecord(r) for r in range(ranks)]
        self.failure_grace = failure_grace
        self.waits = WaitClock()  # ranks at a prompt: their wait is not the run's time
        self.stop_reason: RunStatus | None = None
        """Why the ranks are being (or were) stopped: asked to, a failure, the timeout,
        an interrupt; None while nothing stops them."""
        self.transport: Transport | None = None
        self.listener: Listener | None = None
        self._loop = loop()
        self._done = Event()
        self.failed: list[tuple[float, Failure]] = []  # loop thread; others read failures()
        self._stop_scheduled = False
        self._started_at = time.monotonic()
        self._ended_at: float | None = None
        self._timers: list[asyncio.TimerHandle] = []  # cancelled when the run ends

    # -- reads (any thread) ----------------------------------------------------

    def outcomes(self) -> tuple[RankOutcome, ...]:
        """Each rank as last seen, by rank; final once ``wait`` returns True."""
        return tuple(record.outcome() for record in self.records)

    def failures(self) -> list[tuple[float, Failure]]:
        """Every rank failure so far as ``(time.monotonic(), failure)``, in arrival order."""
        return list(self.failed)

    @property
    def root_cause(self) -> Failure | None:
        """The failure that ended the run, if any (``failures.root_cause``)."""
        return root_cause(list(self.failed), self.failure_grace)

    @property
    def status(self) -> RunStatus:
        """Where the run is; once it has ended, how it ended: a failure wins unless the
        ranks were stopped for another reason."""
        if not self._done.is_set():
            started = any(r.state is not RankState.STARTING for r in self.records)
            return RunStatus.RUNNING if started else RunStatus.STARTING
        if self.root_cause is not None and self.stop_reason in (None, RunStatus.FAILED):
            return RunStatus.FAILED
        return self.stop_reason or RunStatus.DONE

    def elapsed(self) -> float:
        """Seconds from the start until the run ended (or until now, while it goes on)."""
        return (self._ended_at or time.monotonic()) - self._started_at

    def pids(self) -> dict[int, int]:
        """Rank -> pid (on its own node) of the ranks started so far."""
        return {r.rank: r.pid for r in self.records if r.pid is not None}

    def wait(self, timeout: float | None = None) -> bool:
        """True once every rank has ended and all its output has been read."""
        return self._done.wait(timeout)

    # -- requests (any thread) -----------------------------------------------------

    def stop(self, reason: RunStatus = RunStatus.STOPPED) -> None:
        """Stop every rank: SIGTERM to each, SIGKILL after the grace."""
        self.call_soon(self.halt, reason)

    def dump_stacks(self) -> None:
        """Ask every running rank to write all its threads' Python stacks to its stderr."""
        self.call_soon(self.dump_running)

    def answer(self, rank: int, number: int, text: Answer) -> None:
        self.call_soon(self._answer, rank, number, text)

    def call_soon(self, fn: Callable[..., object], *args: object) -> None:
        """Call ``fn(*args)`` on the loop thread."""
        self._loop.call(fn, *args)

    # -- what the transport says (loop thread) -----------------------------------

    def route(self, event: RunEvent) -> None:
        if self.listener is not None:
            self.listener.route(event)
        else:
            self.events.put(event)

    def message(self, rank: int, kind: str, body: Body) -> None:
        """A rank's message that only the listener knows (a session's reply)."""
        if self.listener is not None:
            self.listener.message(rank, kind, body)

    def later(self, delay: float, fn: Callable[..., object], *args: object) -> None:
        """Call ``fn(*args)`` on the loop after ``delay`` seconds, unless the run ends first (a
        pending timer would hold a finished run's memory); spent timers are dropped here."""
        if self._done.is_set():
            return
        now = self._loop.loop.time()
        self._timers = [t for t in self._timers if not t.cancelled() and t.when() > now]
        self._timers.append(self._loop.loop.call_later(delay, fn, *args))

    def fail(self, failure: Failure, when: float | None = None) -> None:
        """Record ``failure`` (``when``: the rank's own time of it, on this process's
        monotonic clock; default now) and stop the others after the grace."""
        if all(f.rank != failure.rank for _, f in self.failed):
            self.failed.append((time.monotonic() if when is None else when, failure))
        if not self._stop_scheduled:
            self._stop_scheduled = True
            self.later(self.failure_grace, self.halt, RunStatus.FAILED)

    def halt(self, reason: RunStatus) -> None:
        """Stop every rank now, for ``reason`` (the first reason stands)."""
        self.stop_reason = self.stop_reason or reason
        self._stop_scheduled = True
        if self.transport is not None and not self._done.is_set():
            self.transport.stop_ranks(reason)

    def end(self) -> None:
        """Every rank's output is complete: the run has ended."""
        if self._done.is_set():
            return
        self._ended_at = time.monotonic()
        self._run_dir.release()  # its logs are complete: prunable from now on
        timers, self._timers = self._timers, []
        for timer in timers:
            # A cancelled handle drops its callback at once, though the loop keeps the
            # handle itself until it would have fired.
            timer.cancel()
        transport, self.transport = self.transport, None
        if transport is not None:
            transport.release()
        if self.listener is not None:
            self.listener.ending()  # before ``Done``: its reader reads why it ended
        self._done.set()
        self.route(Done())
        self.listener = None

    # -- internals (loop thread) ------------------------------------------------

    def _answer(self, rank: int, number: int, text: Answer) -> None:
        record = self.records[rank]
        self.waits.end(rank)
        if record.state is RankState.WAITING:
            record.state = RankState.RUNNING
            self.route(StateChanged(rank, RankState.RUNNING))
        if self.transport is not None:
            self.transport.answer(rank, number, text)

    def dump_running(self) -> list[int]:
        """Ask every running rank for its stacks (loop thread); the ranks asked."""
        # Only ranks that said "started": before that, no thread answers and faulthandler has not
        # claimed the fallback signal (whose default action would kill them).
        if self.transport is None:
            return []
        running = (RankState.RUNNING, RankState.WAITING)
        return self.transport.ask_stacks(
            r.rank for r in self.records if r.state in running and not r.exited
        )


def arm_timeout(core: RunCore, seconds: float) -> None:
    """Dump every rank's stacks after ``seconds`` (less time spent at prompts), then stop
    the run once every rank asked has written them or their C-level dumps had time
    (``stacks_written``). Loop thread."""
    core.later(seconds, _expire, core, seconds)


def stacks_written(core: RunCore) -> None:
    """A rank wrote its stacks: a timed-out run stops once every rank asked has."""
    if core.stop_reason is RunStatus.TIMEOUT and all(
        r.stacks in (None, "written") or r.exited for r in core.records
    ):
        core.halt(RunStatus.TIMEOUT)


def _expire(core: RunCore, seconds: float) -> None:
    if core.wait(0):
        return
    if (delay := core.waits.put_off()) is not None:
        core.later(delay, _expire, core, seconds)
        return
    core.route(Notice(f"timeout of {seconds:g}s reached: dumping stacks, stopping"))
    core.stop_reason = core.stop_reason or RunStatus.TIMEOUT
    if core.dump_running():
        core.later(STACKS_WAIT + STACKS_SIGNAL_WAIT, core.halt, RunStatus.TIMEOUT)
    else:
        core.halt(RunStatus.TIMEOUT)
