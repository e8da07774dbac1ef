"""The job: the one object that owns a run's processes.

Contract: ``Job(spec, payload, node).start()`` chooses the port, starts one
worker per rank of ``node`` (``config.NodeSlice``; default: the whole run,
on this machine), sends each its ``RunOrder`` and hands its fds to a
``Relay``. From then on the job's bookkeeping changes only on the relay
loop thread, in the ``RelaySink`` callbacks. Other threads read the run
only as typed values: ``events`` (a queue of ``events.RunEvent``, ending
with one ``Done``), ``outcomes()`` (a frozen ``RankOutcome`` per rank),
``root_cause``, ``status`` and ``elapsed()``, and ``wait(timeout)`` for the
end; they ask for changes with ``stop()`` / ``dump_stacks()``.

Policy: when a rank fails (raises, exits non-zero, dies by a signal) the
others get ``failure_grace`` seconds to report their own errors, then are
stopped: they would otherwise block in a collective until the backend's
timeout. Stopping a rank sends SIGTERM to its whole process group (its
DataLoader workers too), then SIGKILL after ``kill_grace``. ``timeout``
dumps every rank's stacks into its output, then stops the run. The run
has ended (``wait`` returns True) once every rank has exited and all its
output has been read.

Lifetime: once the run has ended the job holds nothing of it but typed
values: its payload (the arguments' shared memory) is dropped, even while
the user keeps the ``Run``, its timers are cancelled and the relay forgets
it, so reference counting alone frees a finished job.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import signal
import socket
import time
import uuid
from collections.abc import Callable, Iterable
from threading import Event

from nbddp.launcher import launching
from nbddp.launcher.config import JobSpec, NodeSlice
from nbddp.launcher.events import (
    Done,
    Failure,
    InputAsked,
    MetricRows,
    Notice,
    RankOutcome,
    RankState,
    RunEvent,
    RunStatus,
    StateChanged,
    Text,
    run_status,
)
from nbddp.launcher.failures import local_time, root_cause
from nbddp.launcher.logs import new_run_dir
from nbddp.launcher.ports import rendezvous
from nbddp.launcher.prompts import WaitClock
from nbddp.launcher.ranks import RankRecord
from nbddp.launcher.relay import RankPipes, Relay
from nbddp.wire import protocol
from nbddp.wire.descriptors import Packed
from nbddp.wire.payload import Payload
from nbddp.wire.protocol import STACKS_SIGNAL, Body, CallRef, InputAnswer, InputRequest, RunOrder

STACKS_WAIT = 1.0  # seconds a rank gets to answer for its stacks before the signal
STACKS_SIGNAL_WAIT = 0.5  # seconds faulthandler gets to write a signalled dump
ORPHAN_GRACE = 1.0  # seconds a finished rank's children get to close its pipes
PROMPT_RECHECK = 1.0  # seconds between timeout checks while a rank waits at a prompt


class Job:
    """One run's processes (see module contract).

    A subclass (a session's job) overrides the hooks ``_route``, ``_message`` and
    ``_ending`` and calls the services ``_call_soon``, ``_later``, ``_send``,
    ``_drain``, ``_log``, ``_ask_stacks`` and ``_stop``; it reads the run through
    the public methods, never the job's own state.
    """

    CTRL_RESTS = True
    """The relay reads the ranks' messages in batches; False: each as it comes (a
    session's cell replies end its cells)."""

    def __init__(self, spec: JobSpec, payload: Payload, node: NodeSlice | None = None) -> None:
        self.spec = spec
        self.node = node or spec.local()
        """This machine's part of the run: its ranks are the job's (local rank = index)."""
        self.payload: Payload | None = payload
        """The call the ranks run; None once the run has ended (see module contract)."""
        self.run_id = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
        self._run_dir = new_run_dir(self.run_id)  # locked until the run ends; old runs pruned
        self.log_dir = self._run_dir.path
        self.events: queue.SimpleQueue[RunEvent] = queue.SimpleQueue()
        self.port: int | None = None
        self._ranks = [RankRecord(r) for r in range(self.node.ranks)]
        self._done = Event()
        self._failures: list[tuple[float, Failure]] = []  # (when, what), in arrival order
        self._stop_reason: RunStatus | None = None  # STOPPED, FAILED, TIMEOUT or INTERRUPTED
        self._started_at = time.monotonic()
        self._ended_at: float | None = None
        self._relay = Relay(self.log_dir, self, ctrl_rests=self.CTRL_RESTS)
        self._loop = self._relay.loop
        self._stop_scheduled = False
        self._pipes: dict[int, RankPipes] = {}
        self._store: object | None = None  # the rendezvous store, while the run lasts
        self._timers: list[asyncio.TimerHandle] = []  # cancelled when the run ends
        self._waits = WaitClock()  # ranks at a prompt: their wait is not the run's time

    # -- starting ---------------------------------------------------------

    def start(self) -> None:
        """Start every rank (caller thread). Raises if a worker cannot be started."""
        payload = self.payload
        if payload is None:
            raise RuntimeError("this job has already run; start a new one")
        port, notice, self._store = rendezvous(self.spec, self.node)
        self.port = port
        if notice:
            self._route(Notice(notice))
        call = payload.ref()  # one memory file for every rank, closed once they have it
        try:
            links = self._start_ranks(port, call)
            for state, (sock, order) in zip(self._ranks, links, strict=True):
                try:
                    # Blocking send: the worker reads its order as soon as it runs.
                    protocol.send_with_fds(sock, *protocol.encode_with_fds("run", order))
                except OSError:
                    pass  # it already died; the relay reports how
                self._relay.attach(state.rank, self._pipes[state.rank])
        finally:
            call.fds.close()
        if self.spec.timeout is not None:
            self._loop.call(self._arm_timeout, self.spec.timeout)

    def _start_ranks(self, port: int, call: CallRef) -> list[tuple[socket.socket, RunOrder]]:
        """Ask the starter for every rank, then take each (``launching``); each rank's
        link and order."""
        start = launching.starter(self.spec, self.node.ranks)
        base_env = {**os.environ, "NBDDP_ROLE": "worker", "NBDDP_RUN_ID": self.run_id}
        links: list[tuple[socket.socket, RunOrder]] = []
        asked: list[launching.Asked] = []
        try:
            for rank in range(self.node.ranks):
                env = {**base_env, **self.spec.rank_env(self.node, rank, port)}
                asked.append(
                    launching.ask(start, launching.order(self.spec, self.node, rank, env, call))
                )
            for rank in range(self.node.ranks):
                taken = asked.pop(0)
                self._ranks[rank].pid, self._pipes[rank] = taken.take()
                links.append((taken.ours, taken.order))
        except BaseException:  # a rank that cannot start, or an interrupt meanwhile
            for pending in asked:
                pending.give_up()
            self._abandon_start()
            raise
        return links

    def _abandon_start(self) -> None:
        """Starting failed part-way: stop the ranks started so far and wait (bounded)
        until their fds, the store and the run's directory are released, as at the
        end of a run. Ranks never started count as stopped and closed."""
        for record in self._ranks:
            if record.rank not in self._pipes:
                record.state, record.exited, record.closed = RankState.STOPPED, True, True
        self.stop(RunStatus.FAILED)
        for rank, pipes in self._pipes.items():
            self._relay.attach(rank, pipes)
        if not self._pipes:
            self._loop.call(self._end)
        self._done.wait(self.spec.kill_grace + 2 * ORPHAN_GRACE + 1.0)

    # -- requests and reads from other threads -----------------------------

    def stop(self, reason: RunStatus = RunStatus.STOPPED) -> None:
        """Stop every rank (any thread): SIGTERM to each process group, SIGKILL after grace."""
        self._loop.call(self._stop, reason)

    def dump_stacks(self) -> None:
        """Ask every running rank to write all its threads' Python stacks to its stderr."""
        self._loop.call(self._dump_stacks)  # its answer (the ranks asked) is for the loop

    def pids(self) -> dict[int, int]:
        """Rank -> pid of the ranks started so far."""
        return {r.rank: r.pid for r in self._ranks if r.pid is not None}

    def wait(self, timeout: float | None = None) -> bool:
        """True once every rank has exited and all its output has been read."""
        return self._done.wait(timeout)

    def outcomes(self) -> tuple[RankOutcome, ...]:
        """Each rank as the job last saw it, by rank; final once ``wait`` returns True."""
        return tuple(record.outcome() for record in self._ranks)

    def failures(self) -> list[tuple[float, Failure]]:
        """Every rank failure so far as ``(time.monotonic(), failure)``, in arrival order."""
        return list(self._failures)

    @property
    def root_cause(self) -> Failure | None:
        """The failure that ended the run, if any (``failures.root_cause``)."""
        return root_cause(list(self._failures), self.spec.failure_grace)

    @property
    def status(self) -> RunStatus:
        """Where the run is; once it has ended, how it ended."""
        ended = self._done.is_set()
        failed = ended and self.root_cause is not None
        states = (r.state for r in self._ranks)
        return run_status(ended, states, self._stop_reason, failed)

    def elapsed(self) -> float:
        """Seconds from the start until the run ended (or until now, while it goes on)."""
        return (self._ended_at or time.monotonic()) - self._started_at

    # -- relay callbacks (loop thread) -------------------------------------

    def on_output(self, rank: int, stream: str, text: str) -> None:
        """Forward output to the event queue."""
        self._route(Text(rank, stream, text))

    def on_message(self, rank: int, kind: str, body: Body) -> None:
        """Handle a worker message (``protocol``: its body's type depends on ``kind``)."""
        record = self._ranks[rank]
        if kind == "started":
            record.state = RankState.RUNNING
            self._route(StateChanged(rank, RankState.RUNNING))
        elif kind == "result" and isinstance(body, Packed):
            record.value = body
        elif kind == "error":
            record.error = body
            # The worker does not print its traceback (it is raised here once);
            # the rank's log keeps it after everything the rank wrote.
            self._relay.log_at_end(rank, body.logged)
            self._fail(Failure(rank, "raised", error=body), local_time(body.raised_at))
        elif kind == "exit":
            record.exit_request = int(body)
            self._fail(Failure(rank, "exited"))
        elif kind == "metrics":
            self._route(MetricRows(rank, tuple(body)))
        elif kind == "input" and isinstance(body, InputRequest):
            self._waits.begin(rank)
            record.state = RankState.WAITING
            self._drain(rank)  # what it printed before the prompt is shown first
            self._route(StateChanged(rank, RankState.WAITING))
            self._route(InputAsked(rank, body.number, body.prompt, body.password))
        elif kind == "stacks":
            # One event and one write: the dump stays whole, never interleaved
            # with other ranks' output.
            record.stacks = "written"
            self._route(Text(rank, "stderr", body))
            self._relay.log_now(rank, body)
            if self._stop_reason is RunStatus.TIMEOUT and self._stacks_in():
                self._stop(RunStatus.TIMEOUT)
        else:
            self._message(rank, kind, body)

    def answer(self, rank: int, number: int, text: str | None) -> None:
        """Send ``rank`` the user's line for its prompt ``number`` (any thread)."""
        self._call_soon(self._answer, rank, number, text)

    def _answer(self, rank: int, number: int, text: str | None) -> None:
        record = self._ranks[rank]
        self._waits.end(rank)
        if record.state is RankState.WAITING:
            record.state = RankState.RUNNING
            self._route(StateChanged(rank, RankState.RUNNING))
        self._send(rank, "answer", InputAnswer(number, text))

    def on_link_closed(self, rank: int) -> None:
        """A link that closes before its rank said how it ended means the rank died.

        This is the earliest sign of a crash (the kernel closes a dead
        process's sockets at once), so it is recorded before the errors the
        other ranks raise when their collectives break.
        """
        record = self._ranks[rank]
        said = (
            record.value is not None or record.error is not None or record.exit_request is not None
        )
        if not said and self._stop_reason is None:
            self._fail(Failure(rank, "died"))

    def on_exit(self, rank: int, code: int | None) -> None:
        """Classify a rank's exit; a failure stops the others."""
        record = self._ranks[rank]
        record.exited, record.exit_code, record.ended_at = True, code, time.monotonic()
        self._waits.end(rank)
        if record.error is not None:
            record.state = RankState.FAILED
        elif code == 0:
            record.state = RankState.DONE
        elif self._stop_reason is not None and not self._has_failed(rank):
            record.state = RankState.STOPPED  # we ended it; the run's root cause is elsewhere
        else:
            record.state = RankState.FAILED
            self._fail(Failure(rank, "died"))
        self._route(StateChanged(rank, record.state))
        if not record.closed:
            # Children the rank left (DataLoader workers) may still hold its pipes.
            self._later(ORPHAN_GRACE, self._reap_orphans, rank)

    def on_closed(self, rank: int) -> None:
        """A rank's output is complete; the run has ended when all are."""
        self._ranks[rank].closed = True
        if all(r.closed for r in self._ranks):
            self._end()

    def _end(self) -> None:
        """Every rank's output is complete: the run has ended (loop thread)."""
        if not self._done.is_set():
            self._ended_at = time.monotonic()
            self._store = None  # shuts the store's server down
            self._run_dir.release()  # its logs are complete: prunable from now on
            self._release()
            # The end first: a reader that takes ``Done`` at once may ask for
            # ``status``, which reads it.
            self._ending()
            self._done.set()
            self._route(Done())

    def _release(self) -> None:
        """Let go of what only a running job needs (see module contract: lifetime)."""
        self.payload = None
        timers, self._timers = self._timers, []
        for timer in timers:
            # A cancelled handle drops its callback at once, though the loop
            # keeps the handle itself until it would have fired.
            timer.cancel()
        self._relay.close()

    # -- hooks a subclass may override (loop thread) -------------------------

    def _route(self, event: RunEvent) -> None:
        """Hand ``event`` to the run's reader: ``events``."""
        self.events.put(event)

    def _message(self, rank: int, kind: str, body: Body) -> None:
        """A worker message of a kind the job itself does not handle: ignored."""

    def _ending(self) -> None:
        """Every rank's output is complete; called once, before ``wait`` returns True."""

    # -- services for a subclass (loop thread, but ``_call_soon``) ----------

    def _call_soon(self, fn: Callable[..., object], *args: object) -> None:
        """Call ``fn(*args)`` on the loop thread (from any thread)."""
        self._loop.call(fn, *args)

    def _later(self, delay: float, fn: Callable[..., object], *args: object) -> None:
        """Call ``fn(*args)`` on the loop after ``delay`` seconds, unless the run ends first.

        Why not ``loop.call_later`` directly: a pending timer holds the job, and would
        keep a finished run's memory for its whole delay; spent timers are dropped
        here, so a long session does not pile them up."""
        if self._done.is_set():
            return
        now = self._loop.loop.time()
        self._timers = [t for t in self._timers if not t.cancelled() and t.when() > now]
        self._timers.append(self._loop.call_later(delay, fn, *args))

    def _send(self, rank: int, kind: str, body: object) -> bool:
        """Send ``rank``'s worker a small message (``relay.Relay.send``)."""
        return self._relay.send(rank, kind, body)

    def _drain(self, rank: int) -> None:
        """Read what ``rank`` wrote so far, now (``relay.Relay.drain``)."""
        self._relay.drain(rank)

    def _put_off(self) -> float | None:
        """For a timeout that fires: how much later to look again, as time ranks spent at
        a prompt is the user's, not the run's; None: it stands."""
        owed = self._waits.owed()
        return max(owed, PROMPT_RECHECK) if owed > 0 or self._waits.waiting else None

    def _log(self, rank: int, text: str) -> None:
        """Append ``text`` to ``rank``'s log."""
        self._relay.log_now(rank, text)

    @property
    def stop_reason(self) -> RunStatus | None:
        """Why the ranks are being (or were) stopped: asked to, a failure, the timeout,
        an interrupt; None while nothing stops them."""
        return self._stop_reason

    # -- loop-thread internals ---------------------------------------------

    def _has_failed(self, rank: int) -> bool:
        return any(f.rank == rank for _, f in self._failures)

    def _fail(self, failure: Failure, when: float | None = None) -> None:
        """Record ``failure`` (``when``: the rank's own time of it, on the notebook's
        monotonic clock; default now) and stop the others after the grace."""
        if not self._has_failed(failure.rank):
            self._failures.append((time.monotonic() if when is None else when, failure))
        if not self._stop_scheduled:
            self._stop_scheduled = True
            self._later(self.spec.failure_grace, self._stop, RunStatus.FAILED)

    def _stop(self, reason: RunStatus) -> None:
        if self._stop_reason is None:
            self._stop_reason = reason
        self._stop_scheduled = True
        if self._signal_all(signal.SIGTERM):
            self._later(self.spec.kill_grace, self._signal_all, signal.SIGKILL)

    def _signal_all(self, sig: int) -> bool:
        """Signal each rank's processes (``RankRecord.signal``); True if any was there."""
        return any([record.signal(sig) for record in self._ranks])

    def _dump_stacks(self) -> list[int]:
        """Ask every running rank for its stacks (``_ask_stacks``); the ranks asked."""
        # Only ranks that said "started": before that, no thread answers and
        # faulthandler has not claimed the fallback signal (whose default
        # action would kill them).
        return self._ask_stacks(
            r.rank
            for r in self._ranks
            if r.state in (RankState.RUNNING, RankState.WAITING) and not r.exited
        )

    def _ask_stacks(self, ranks: Iterable[int]) -> list[int]:
        """Ask ``ranks`` for their stacks; those that do not answer within
        ``STACKS_WAIT`` are signalled for a C-level dump. The ranks asked."""
        asked = []
        for rank in ranks:
            record = self._ranks[rank]
            record.stacks = None
            if self._relay.ask(rank, "stacks"):
                record.stacks = "asked"
                asked.append(rank)
        self._later(STACKS_WAIT, self._signal_for_stacks, asked)
        return asked

    def _signal_for_stacks(self, asked: list[int]) -> None:
        # A rank that did not answer has a thread holding the GIL (C code that
        # never releases it): faulthandler can still dump from the signal handler.
        for rank in asked:
            record = self._ranks[rank]
            if record.stacks != "asked" or record.exited or record.pid is None:
                continue
            record.stacks = "signalled"
            self._route(
                Notice(
                    f"rank {rank} did not answer for its stacks within {STACKS_WAIT:g}s "
                    "(a thread holds the GIL): its C-level dump follows in its output"
                )
            )
            with contextlib.suppress(ProcessLookupError):
                os.kill(record.pid, STACKS_SIGNAL)

    def _stacks_in(self) -> bool:
        """Every rank asked for its stacks has written them (none was signalled)."""
        return all(r.stacks in (None, "written") or r.exited for r in self._ranks)

    def _reap_orphans(self, rank: int) -> None:
        record = self._ranks[rank]
        if not record.closed:
            record.signal(signal.SIGKILL)
            self._later(ORPHAN_GRACE, self._relay.force_close, rank)

    def _arm_timeout(self, seconds: float) -> None:
        self._later(seconds, self._expire, seconds)

    def _expire(self, seconds: float) -> None:
        """The run's timeout has passed: dump every rank's stacks, then stop, once every
        rank has written them (``on_message``) or at the latest when the C-level dumps
        of those that could not have had time."""
        if self._done.is_set():
            return
        if (delay := self._put_off()) is not None:
            self._later(delay, self._expire, seconds)
            return
        self._route(Notice(f"timeout of {seconds:g}s reached: dumping stacks, stopping"))
        self._stop_reason = self._stop_reason or RunStatus.TIMEOUT
        if self._dump_stacks():
            self._later(STACKS_WAIT + STACKS_SIGNAL_WAIT, self._stop, RunStatus.TIMEOUT)
        else:
            self._stop(RunStatus.TIMEOUT)
