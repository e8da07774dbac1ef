"""The job: the one object that owns a run's processes.

Contract: ``Job(config, payload).start()`` chooses the port, starts one
worker per rank, sends each its ``RunOrder`` and hands its fds to a
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
values. Its payload is dropped (the shared memory of the arguments is
freed, even while the user keeps the ``Run``), its pending timers are
cancelled and the relay forgets it, so nothing but the user's references
keeps a finished job alive, and reference counting alone frees it (no
cycle waits for the garbage collector).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import signal
import socket
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from threading import Event
from typing import Any

import psutil

from nbddp.launcher.config import LaunchConfig
from nbddp.launcher.events import (
    Done,
    Failure,
    MetricRows,
    Notice,
    RankOutcome,
    RankState,
    RunEvent,
    RunStatus,
    StacksTaken,
    StateChanged,
    Text,
    run_status,
)
from nbddp.launcher.failures import root_cause
from nbddp.launcher.fds import NOTEBOOK_FDS
from nbddp.launcher.logs import new_run_dir
from nbddp.launcher.ports import choose_port, host_store, listen
from nbddp.launcher.relay import RankPipes, Relay
from nbddp.launcher.starters import Child, ChildFds, Starter, Starting, starter
from nbddp.wire import protocol
from nbddp.wire.descriptors import Packed
from nbddp.wire.payload import Payload
from nbddp.wire.protocol import STACKS_SIGNAL, ErrorInfo, Placement, RunOrder

STACKS_WAIT = 1.0  # seconds a rank gets to answer for its stacks before the signal
STACKS_SIGNAL_WAIT = 0.5  # seconds faulthandler gets to write a signalled dump
STACKS_POLL = 0.05  # seconds between looks at whether every asked rank has answered
ORPHAN_GRACE = 1.0  # seconds a finished rank's children get to close its pipes


@dataclass
class _RankRecord:
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
        return RankOutcome(
            rank=self.rank,
            state=self.state,
            pid=self.pid,
            exit_code=self.exit_code,
            exited=self.exited,
            value=self.value,
            error=self.error,
            stacks=self.stacks,
            started_at=self.started_at,
            ended_at=self.ended_at,
        )


@dataclass
class _Asked:
    """A rank asked of the starter, not yet started: the notebook's ends of its fds."""

    record: _RankRecord
    ours: socket.socket
    out_r: int
    err_r: int
    order: RunOrder
    starting: Starting | None = None

    def give_up(self) -> None:
        """Close the notebook's ends: a worker started for this rank (the forkserver
        may fork it later) finds its link closed, so it knows no order will come."""
        if self.starting is not None:
            self.starting.abandon()
        for fd in (self.ours.fileno(), self.out_r, self.err_r):
            NOTEBOOK_FDS.release(fd)
        self.ours.close()
        os.close(self.out_r)
        os.close(self.err_r)


class Job:
    """One run's processes (see module contract)."""

    def __init__(self, config: LaunchConfig, payload: Payload) -> None:
        self.config = config
        self.payload: Payload | None = payload
        """The call the ranks run; None once the run has ended (see module contract)."""
        self.run_id = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
        self._run_dir = new_run_dir(self.run_id)  # locked until the run ends; old runs pruned
        self.log_dir = self._run_dir.path
        self.events: queue.SimpleQueue[RunEvent] = queue.SimpleQueue()
        self.port: int | None = None
        self._ranks = [_RankRecord(r) for r in range(config.world_size)]
        self._done = Event()
        self._failures: list[tuple[float, Failure]] = []  # (when, what), in arrival order
        self._stop_reason: RunStatus | None = None  # STOPPED, FAILED, TIMEOUT or INTERRUPTED
        self._started_at = time.monotonic()
        self._ended_at: float | None = None
        self._relay = Relay(self.log_dir, self)
        self._loop = self._relay.loop
        self._stop_scheduled = False
        self._signal_waited = False  # the timeout's stop has waited for signalled dumps
        self._pipes: dict[int, RankPipes] = {}
        self._store: object | None = None  # the rendezvous store, while the run lasts
        self._timers: list[asyncio.TimerHandle] = []  # cancelled when the run ends

    # -- starting ---------------------------------------------------------

    def start(self) -> None:
        """Start every rank (caller thread). Raises if a worker cannot be started."""
        payload = self.payload
        if payload is None:
            raise RuntimeError("this job has already run; start a new one")
        port, notice = self._rendezvous()
        self.port = port
        if notice:
            self._emit(Notice(notice))
        start = starter(self.config)
        base_env = {**os.environ, "NBDDP_ROLE": "worker", "NBDDP_RUN_ID": self.run_id}
        links: list[tuple[socket.socket, RunOrder]] = []
        asked: list[_Asked] = []
        try:
            # Every rank is asked for before any is waited for, so that their
            # forks (each in its own keeper) go on side by side.
            for state in self._ranks:
                env = {**base_env, **self.config.rank_env(state.rank, port)}
                asked.append(self._ask_rank(start, state, env))
            while asked:
                links.append(self._take_rank(asked.pop(0)))
        except BaseException:  # a rank that cannot start, or an interrupt meanwhile
            for pending in asked:
                pending.give_up()
            self._abandon_start()
            raise
        for state, (sock, order) in zip(self._ranks, links, strict=True):
            try:
                # Blocking send: the worker reads its order as soon as it runs.
                protocol.send(sock, "run", order)
                if payload.fds:
                    socket.send_fds(sock, [b"\0"], list(payload.fds))
            except OSError:
                pass  # it already died; the relay reports how
            self._relay.attach(state.rank, self._pipes[state.rank])
        if self.config.timeout is not None:
            self._loop.call(self._arm_timeout, self.config.timeout)

    def _rendezvous(self) -> tuple[int, str | None]:
        """Choose the port; when the notebook hosts the store, start it (see LaunchConfig)."""
        cfg = self.config
        if cfg.node is not None:  # one node of a cluster run: its store is already listening
            return cfg.node.port, None
        if not cfg.host_store:
            return choose_port(cfg.master_addr, cfg.port, fallback=cfg.port_fallback)
        sock, notice = listen(cfg.master_addr, cfg.port, fallback=cfg.port_fallback)
        port = int(sock.getsockname()[1])
        self._store = host_store(cfg.master_addr, sock)
        return port, notice

    def _ask_rank(self, start: Starter, record: _RankRecord, env: dict[str, str]) -> _Asked:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        NOTEBOOK_FDS.keep(ours.fileno(), out_r, err_r)
        asked = _Asked(record, ours, out_r, err_r, self._order(record.rank, env))
        try:
            asked.starting = start.start(ChildFds(theirs.fileno(), out_w, err_w), env)
        except BaseException:
            asked.give_up()
            raise
        finally:
            theirs.close()
            os.close(out_w)
            os.close(err_w)
        return asked

    def _take_rank(self, asked: _Asked) -> tuple[socket.socket, RunOrder]:
        """Wait for an asked-for rank's pid; from then on its pipes are the job's."""
        starting, asked.starting = asked.starting, None  # child() releases its own if it raises
        assert starting is not None
        try:
            child: Child = starting.child()
        except BaseException:
            asked.give_up()
            raise
        NOTEBOOK_FDS.keep(child.status_fd)
        asked.record.pid = child.pid
        pipes = RankPipes(asked.out_r, asked.err_r, asked.ours, child.status_fd)
        self._pipes[asked.record.rank] = pipes
        return asked.ours, asked.order

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
        self._done.wait(self.config.kill_grace + 2 * ORPHAN_GRACE + 1.0)

    def _order(self, rank: int, env: dict[str, str]) -> RunOrder:
        cfg, payload = self.config, self.payload
        assert payload is not None  # start() checked: a run's payload goes only at its end
        place = Placement(
            rank=cfg.global_rank(rank),
            local_rank=rank,
            world_size=cfg.total_ranks,
            local_world_size=cfg.world_size,
            device=cfg.device,
            cuda_index=rank if cfg.device == "cuda" else None,
        )
        return RunOrder(
            place=place,
            env=env,
            payload=payload.data,
            fd_count=len(payload.fds),
            sys_path=list(sys.path),
            cwd=os.getcwd(),
            backend=cfg.backend,
            init_process_group=cfg.init_process_group,
            threads=cfg.threads,
        )

    # -- requests and reads from other threads -----------------------------

    def stop(self, reason: RunStatus = RunStatus.STOPPED) -> None:
        """Stop every rank (any thread): SIGTERM to each process group, SIGKILL after grace."""
        self._loop.call(self._stop, reason)

    def dump_stacks(self) -> None:
        """Ask every running rank to write all its threads' Python stacks to its stderr."""
        self._loop.call(self._dump_stacks)

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
        return root_cause(list(self._failures), self.config.failure_grace)

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
        self._emit(Text(rank, stream, text))

    def on_message(self, rank: int, kind: str, body: Any) -> None:
        """Handle a worker message (``protocol``: its body's type depends on ``kind``)."""
        record = self._ranks[rank]
        if kind == "started":
            record.state = RankState.RUNNING
            self._emit(StateChanged(rank, RankState.RUNNING))
        elif kind == "result" and isinstance(body, Packed):
            record.value = body
        elif kind == "error":
            record.error = body
            # The worker does not print its traceback (it is raised here once);
            # the rank's log keeps it after everything the rank wrote.
            self._relay.log_at_end(rank, body.traceback)
            self._fail(Failure(rank, "raised", error=body), _monotonic(body.raised_at))
        elif kind == "exit":
            record.exit_request = int(body)
            self._fail(Failure(rank, "exited"))
        elif kind == "metrics":
            self._emit(MetricRows(rank, tuple(body)))
        elif kind == "stacks":
            # One event and one write: the dump stays whole, never interleaved
            # with other ranks' output.
            record.stacks = "written"
            self._emit(Text(rank, "stderr", body))
            self._relay.log_now(rank, body)

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
        if record.error is not None:
            record.state = RankState.FAILED
        elif code == 0:
            record.state = RankState.DONE
        elif self._stop_reason is not None and not self._has_failed(rank):
            record.state = RankState.STOPPED  # we ended it; the run's root cause is elsewhere
        else:
            record.state = RankState.FAILED
            self._fail(Failure(rank, "died"))
        self._emit(StateChanged(rank, record.state))
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
            self._done.set()
            self._emit(Done())

    def _release(self) -> None:
        """Let go of what only a running job needs (see module contract: lifetime)."""
        self.payload = None
        timers, self._timers = self._timers, []
        for timer in timers:
            # A cancelled handle drops its callback at once, though the loop
            # keeps the handle itself until it would have fired.
            timer.cancel()
        self._relay.close()

    # -- loop-thread internals ---------------------------------------------

    def _emit(self, event: RunEvent) -> None:
        """Hand ``event`` to the run's reader (a session routes it to the running cell)."""
        self.events.put(event)

    def _later(self, delay: float, fn: Callable[..., object], *args: object) -> None:
        """Call ``fn(*args)`` on the loop after ``delay`` seconds, unless the run ends first.

        Why not ``loop.call_later`` directly: a pending timer holds the job,
        and would keep a finished run's memory for its whole delay."""
        if not self._done.is_set():  # bounded: a handful per rank, a few dozen stacks polls
            self._timers.append(self._loop.call_later(delay, fn, *args))

    def _has_failed(self, rank: int) -> bool:
        return any(f.rank == rank for _, f in self._failures)

    def _fail(self, failure: Failure, when: float | None = None) -> None:
        """Record ``failure`` (``when``: the rank's own time of it, on the notebook's
        monotonic clock; default now) and stop the others after the grace."""
        if not self._has_failed(failure.rank):
            self._failures.append((time.monotonic() if when is None else when, failure))
        if not self._stop_scheduled:
            self._stop_scheduled = True
            self._later(self.config.failure_grace, self._stop, RunStatus.FAILED)

    def _stop(self, reason: RunStatus) -> None:
        if self._stop_reason is None:
            self._stop_reason = reason
        self._stop_scheduled = True
        if self._signal_all(signal.SIGTERM, True):
            self._later(self.config.kill_grace, self._signal_all, signal.SIGKILL, True)

    def _signal_all(self, sig: int, include_orphans: bool) -> bool:
        """Signal each rank's process group; True if any process was still there.

        An exited rank is signalled only with ``include_orphans`` and only
        until its pipes close: its group id cannot be reused while members
        remain, but once they are gone the number could name someone else's.
        """
        any_alive = False
        for record in self._ranks:
            if record.pid is None or record.closed or (record.exited and not include_orphans):
                continue
            any_alive |= _signal_group(record.pid, sig, tree=not record.exited)
        return any_alive

    def _dump_stacks(self) -> None:
        """Ask every running rank for its stacks; signal the ones that do not answer."""
        asked = []
        # Only ranks that said "started": before that, no thread answers and
        # faulthandler has not claimed the fallback signal (whose default
        # action would kill them).
        for record in self._ranks:
            running = record.state is RankState.RUNNING and not record.exited
            if running and self._relay.ask(record.rank, "stacks"):
                record.stacks = "asked"
                asked.append(record.rank)
        self._later(STACKS_WAIT, self._signal_for_stacks, asked)

    def _signal_for_stacks(self, asked: list[int]) -> None:
        # A rank that did not answer has a thread holding the GIL (C code that
        # never releases it): faulthandler can still dump from the signal handler.
        for rank in asked:
            record = self._ranks[rank]
            if record.stacks != "asked" or record.exited or record.pid is None:
                continue
            record.stacks = "signalled"
            self._emit(
                Notice(
                    f"rank {rank} did not answer for its stacks within {STACKS_WAIT:g}s "
                    "(a thread holds the GIL): its C-level dump follows in its output"
                )
            )
            with contextlib.suppress(ProcessLookupError):
                os.kill(record.pid, STACKS_SIGNAL)

    def _stacks_pending(self) -> bool:
        return any(r.stacks == "asked" and not r.exited for r in self._ranks)

    def _reap_orphans(self, rank: int) -> None:
        record = self._ranks[rank]
        if record.closed or record.pid is None:
            return
        _signal_group(record.pid, signal.SIGKILL, tree=False)
        self._later(ORPHAN_GRACE, self._relay.force_close, rank)

    def _arm_timeout(self, seconds: float) -> None:
        self._later(seconds, self._expire, seconds)

    def _expire(self, seconds: float) -> None:
        """The run's timeout has passed: dump every rank's stacks, then stop."""
        if self._done.is_set():
            return
        self._emit(Notice(f"timeout of {seconds:g}s reached: dumping stacks, stopping"))
        self._stop_reason = self._stop_reason or RunStatus.TIMEOUT
        self._dump_stacks()
        self._stop_when_dumped(time.monotonic() + STACKS_WAIT + STACKS_SIGNAL_WAIT)

    def _stop_when_dumped(self, stop_at: float) -> None:
        # The stop waits for the ranks' answers (or the C-level dumps of
        # those that could not answer), never longer than stop_at.
        if self._stacks_pending() and time.monotonic() < stop_at:
            self._later(STACKS_POLL, self._stop_when_dumped, stop_at)
        elif any(r.stacks == "signalled" for r in self._ranks) and not self._signal_waited:
            self._signal_waited = True
            self._later(STACKS_SIGNAL_WAIT, self._stop, RunStatus.TIMEOUT)
        else:
            self._stop(RunStatus.TIMEOUT)


def _monotonic(wall: float | None) -> float | None:
    """A rank's ``time.time()`` stamp on this process's monotonic clock (one machine,
    one wall clock), never later than now; None stays None."""
    if wall is None:
        return None
    now = time.monotonic()
    return min(now, now - (time.time() - wall))


def _signal_group(pid: int, sig: int, *, tree: bool) -> bool:
    """Signal the process group led by ``pid``; with ``tree``, its live descendants too.

    ``tree`` only while ``pid`` is known to be our live rank: a reaped pid
    may already belong to another process.
    """
    alive = False
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
        alive = True
    if not tree:
        return alive
    # Descendants that left the group (setsid) are still found through the tree.
    with contextlib.suppress(psutil.Error):
        for proc in psutil.Process(pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                proc.send_signal(sig)
                alive = True
    return alive
