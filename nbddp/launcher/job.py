"""The job: the transport that starts a run's ranks on this machine and owns their processes.

Contract: ``Job(spec, payload, node).start()`` chooses the port, starts one worker per rank of
``node`` (``config.NodeSlice``; default: the whole run, on this machine), sends each its
``RunOrder`` and hands its fds to a ``Relay``. Its ``core`` (``core.RunCore``) keeps the run's
bookkeeping and is what other threads read and ask. Stopping a rank sends SIGTERM to its whole
process group (its DataLoader workers too), then SIGKILL after ``kill_grace``. Once the run has
ended the job drops its payload (the arguments' shared memory) and the relay forgets it, so
reference counting alone frees it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable

from nbddp.launcher import launching
from nbddp.launcher.config import JobSpec, NodeSlice
from nbddp.launcher.core import STACKS_WAIT, RankRecord, RunCore, arm_timeout, stacks_written
from nbddp.launcher.events import (
    Failure,
    InputAsked,
    MetricRows,
    Notice,
    RankState,
    RunStatus,
    StateChanged,
    Text,
)
from nbddp.launcher.failures import local_time
from nbddp.launcher.forkserver_link import interrupts_after
from nbddp.launcher.ports import rendezvous
from nbddp.launcher.relay import RankPipes, Relay, Unsent
from nbddp.wire import protocol
from nbddp.wire.descriptors import Packed
from nbddp.wire.payload import Payload
from nbddp.wire.protocol import (
    STACKS_SIGNAL,
    Answer,
    Body,
    CellOrder,
    InputAnswer,
    InputRequest,
)

ORPHAN_GRACE = 1.0  # seconds a finished rank's children get to close its pipes


class Job:
    """One run's processes on this machine."""

    def __init__(
        self,
        spec: JobSpec,
        payload: Payload,
        node: NodeSlice | None = None,
        *,
        session: bool = False,
    ) -> None:
        self.spec = spec
        self.node = node or spec.local()
        """This machine's part of the run: its ranks are the job's (local rank = index)."""
        self.payload: Payload | None = payload
        """The call the ranks run; None once the run has ended."""
        self.core = RunCore(self.node.ranks, spec.failure_grace)
        self.core.transport = self
        self.log_dir, self.run_id = self.core.log_dir, self.core.run_id
        # A session's cell ends when its replies are read: they must not wait a tick.
        self._relay = Relay(self.log_dir, self, ctrl_rests=not session)
        self._ranks = self.core.records
        self._pipes: dict[int, RankPipes] = {}  # started ranks' pipes until relayed
        self._store: object | None = None  # the rendezvous store, while the run lasts

    # -- starting ---------------------------------------------------------

    def start(self) -> None:
        """Start every rank (caller thread). Raises if a worker cannot be started."""
        assert self.payload is not None, "a job starts once, right after it is made"
        port, notice, self._store = rendezvous(self.spec, self.node)
        if notice:
            self.core.call_soon(self.core.route, Notice(notice))
        call = self.payload.ref()  # one memory file for every rank, closed once they have it
        start = launching.starter(self.spec, self.node.ranks)
        asked: list[launching.Asked] = []  # asked for, not yet taken
        taken: list[launching.Asked] = []
        try:
            # Every rank is asked for before any is taken, and taken before any runs.
            for rank in range(self.node.ranks):
                order = launching.order(self.spec, self.node, rank, port, call, self.run_id)
                asked.append(launching.ask(start, order))
            for state in self._ranks:
                taken.append(asked.pop(0))  # its take() releases its fds if it raises
                state.pid, self._pipes[state.rank] = taken[-1].take()
            for state, link in zip(self._ranks, taken, strict=True):
                # Blocking send: the worker reads its order as soon as it runs. An OSError:
                # it already died, and the relay reports how.
                with contextlib.suppress(OSError):
                    protocol.send_with_fds(link.ours, *protocol.encode_with_fds("run", link.order))
                with interrupts_after():  # relayed and forgotten here in one step
                    self._relay.attach(state.rank, self._pipes.pop(state.rank))
        except BaseException:  # a rank that cannot start, or an interrupt meanwhile
            for pending in asked:
                pending.give_up()
            self._abandon_start()
            raise
        finally:
            call.fds.close()
        if self.spec.timeout is not None:
            self.core.call_soon(arm_timeout, self.core, self.spec.timeout)

    def _abandon_start(self) -> None:
        """Starting failed part-way: stop the ranks started so far and wait (bounded)
        until their fds, the store and the run's directory are released, as at the
        end of a run. Ranks never started count as stopped and closed."""
        for record in self._ranks:
            if record.pid is None:
                record.state, record.exited, record.closed = RankState.STOPPED, True, True
        self.core.stop(RunStatus.FAILED)
        for rank, pipes in self._pipes.items():  # started, not yet relayed
            self._relay.attach(rank, pipes)
        if all(record.pid is None for record in self._ranks):
            self.core.call_soon(self.core.end)
        self.core.wait(self.spec.kill_grace + 2 * ORPHAN_GRACE + 1.0)

    # -- relay callbacks (loop thread) -------------------------------------

    def on_output(self, rank: int, stream: str, text: str) -> None:
        self.core.route(Text(rank, stream, text))

    def on_message(self, rank: int, kind: str, body: Body) -> None:
        """Handle a worker message (``protocol``: its body's type depends on ``kind``)."""
        record, core = self._ranks[rank], self.core
        if kind == "started":
            record.state = RankState.RUNNING
            core.route(StateChanged(rank, RankState.RUNNING))
        elif kind == "result" and isinstance(body, Packed):
            record.value = body
        elif kind == "error":
            record.error = body
            # The worker does not print its traceback (it is raised here once);
            # the rank's log keeps it after everything the rank wrote.
            self._relay.log_at_end(rank, body.logged)
            core.fail(Failure(rank, "raised", error=body), local_time(body.raised_at))
        elif kind == "exit":
            record.exit_request = int(body)
            core.fail(Failure(rank, "exited"))
        elif kind == "metrics":
            core.route(MetricRows(rank, tuple(body)))
        elif kind == "input" and isinstance(body, InputRequest):
            core.waits.begin(rank)
            record.state = RankState.WAITING
            self.drain(rank)  # what it printed before the prompt is shown first
            core.route(StateChanged(rank, RankState.WAITING))
            core.route(InputAsked(rank, body.number, body.prompt, body.password))
        elif kind == "stacks":
            # One event and one write: the dump stays whole, never interleaved
            # with other ranks' output.
            record.stacks = "written"
            core.route(Text(rank, "stderr", body))
            self._relay.log_now(rank, body)
            core.message(rank, kind, None)
            stacks_written(core)
        else:
            core.message(rank, kind, body)

    def on_link_closed(self, rank: int, unsent: list[str]) -> None:
        """A link that closes before its rank said how it ended means the rank died: the earliest
        sign of a crash, ahead of the errors it causes in the other ranks' collectives. Messages
        to it not sent whole (``unsent``) are said in a notice."""
        if unsent:
            self.core.route(Notice(f"rank {rank}: {', '.join(unsent)} was not sent whole"))
        record = self._ranks[rank]
        said = any(x is not None for x in (record.value, record.error, record.exit_request))
        if not said and self.core.stop_reason is None:
            self.core.fail(Failure(rank, "died"))

    def on_exit(self, rank: int, code: int | None) -> None:
        """Classify a rank's exit; a failure stops the others."""
        record = self._ranks[rank]
        record.exited, record.exit_code, record.ended_at = True, code, time.monotonic()
        self.core.waits.end(rank)
        if record.error is not None:
            record.state = RankState.FAILED
        elif code == 0:
            record.state = RankState.DONE
        elif self.core.stop_reason is not None and all(f.rank != rank for _, f in self.core.failed):
            record.state = RankState.STOPPED  # we ended it; the run's root cause is elsewhere
        else:
            record.state = RankState.FAILED
            self.core.fail(Failure(rank, "died"))
        self.core.route(StateChanged(rank, record.state))
        if not record.closed:
            # Children the rank left (DataLoader workers) may still hold its pipes.
            self.core.later(ORPHAN_GRACE, _reap_orphans, record, self._relay, self.core)

    def on_closed(self, rank: int) -> None:
        """A rank's output is complete; the run has ended when all are."""
        self._ranks[rank].closed = True
        if all(r.closed for r in self._ranks):
            self.core.end()

    # -- the transport (loop thread) -----------------------------------------------

    def release(self) -> None:
        """The run has ended: drop the store, the payload and the relay's hold."""
        self._store = None  # shuts the store's server down
        self.payload = None
        self._relay.close()

    def stop_ranks(self, reason: RunStatus) -> None:
        if _signal_all(self._ranks, signal.SIGTERM):
            self.core.later(self.spec.kill_grace, _signal_all, self._ranks, signal.SIGKILL)

    def answer(self, rank: int, number: int, text: Answer) -> None:
        self.send(rank, "answer", InputAnswer(number, text))

    def send(self, rank: int, kind: str, body: object) -> None:
        """Send ``rank``'s worker ``(kind, body)``, any size (``relay.Relay.send``): whole, or
        a notice says it was not (its link closed: the run reports how the rank ended)."""
        try:
            self._relay.send(rank, kind, body)
        except Unsent as exc:
            if not self.core.wait(0):
                self.core.route(Notice(str(exc)))

    def drain(self, rank: int) -> None:
        """Read what ``rank`` wrote so far, now (``relay.Relay.drain``)."""
        self._relay.drain(rank)

    def log(self, rank: int, text: str) -> None:
        self._relay.log_now(rank, text)

    def where(self, rank: int) -> str:
        return ""

    def cell_order(self, number: int, payload: Payload, debug: bool) -> CellOrder:
        return CellOrder(number, payload.ref(), debug)

    def send_cell(self, order: object, ranks: list[int]) -> None:
        """Send ``order`` to ``ranks`` (a closed link ends the session), then close it."""
        assert isinstance(order, CellOrder)
        try:
            for rank in ranks:
                self.send(rank, "cell", order)
        finally:
            order.call.fds.close()  # the relay keeps copies of the descriptors until sent

    def ask_stacks(self, ranks: Iterable[int]) -> list[int]:
        """Ask ``ranks`` for their stacks; those that do not answer within
        ``STACKS_WAIT`` are signalled for a C-level dump. The ranks asked."""
        asked = []
        for rank in ranks:
            record = self._ranks[rank]
            record.stacks = None
            try:
                self._relay.send(rank, "stacks", None)
            except Unsent:
                continue  # its link has closed: it has ended, with no stacks to give
            record.stacks = "asked"
            asked.append(rank)
        self.core.later(STACKS_WAIT, self._signal_for_stacks, asked)
        return asked

    # -- internals (loop thread) ---------------------------------------------

    def _signal_for_stacks(self, asked: list[int]) -> None:
        # A rank that did not answer has a thread holding the GIL (C code that
        # never releases it): faulthandler can still dump from the signal handler.
        for rank in asked:
            record = self._ranks[rank]
            if record.stacks != "asked" or record.exited or record.pid is None:
                continue
            record.stacks = "signalled"
            self.core.route(
                Notice(
                    f"rank {rank} did not answer for its stacks within {STACKS_WAIT:g}s "
                    "(a thread holds the GIL): its C-level dump follows in its output"
                )
            )
            with contextlib.suppress(ProcessLookupError):
                os.kill(record.pid, STACKS_SIGNAL)


def _signal_all(records: list[RankRecord], sig: int) -> bool:
    """Signal each rank's processes (``RankRecord.signal``); True if any was there."""
    return any([record.signal(sig) for record in records])


def _reap_orphans(record: RankRecord, relay: Relay, core: RunCore) -> None:
    """A rank exited ``ORPHAN_GRACE`` ago and children it left still hold its pipes:
    kill them, and close the pipes after as long again."""
    if not record.closed:
        record.signal(signal.SIGKILL)
        core.later(ORPHAN_GRACE, relay.force_close, record.rank)
