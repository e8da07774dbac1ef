"""Restarts: after a failure, every rank is stopped and the whole group started again.

``Restarting(first, payload)`` is a ``RunSource`` over a started ``Job`` and its replacements: an
attempt that ``failed`` (not stopped, interrupted or timed out), with restarts left under
``max_restarts``, gets a ``Notice`` and a new ``Job`` on a fresh port with
``TORCHELASTIC_RESTART_COUNT`` one higher. Events of every attempt go to one queue; only the
last's ``Done`` ends it. Restarts run on their own thread; reads are the current attempt's.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import replace

from nbddp.launcher.events import Done, Failure, Notice, RankOutcome, RunEvent, RunStatus
from nbddp.launcher.failures import run_error
from nbddp.launcher.job import Job
from nbddp.wire.payload import Payload, short_error
from nbddp.wire.protocol import Answer


class Restarting:
    """A run that restarts its ranks after a failure."""

    def __init__(self, first: Job, payload: Payload) -> None:
        self.events: queue.SimpleQueue[RunEvent] = queue.SimpleQueue()
        self._payload: Payload | None = payload  # dropped at the end: its shared memory goes
        self._job = first
        self.log_dir, self.run_id = first.log_dir, first.run_id  # the current attempt's
        self._lock = threading.Lock()
        self._stopped = False
        self._done = threading.Event()
        threading.Thread(target=self._forward, name="nbddp-restarts", daemon=True).start()

    # -- RunSource: the current attempt's ---------------------------------

    @property
    def root_cause(self) -> Failure | None:
        """The current (once ended: the last) attempt's root-cause failure."""
        return self._job.core.root_cause

    @property
    def status(self) -> RunStatus:
        """Running until the last attempt has ended; then how it ended."""
        return self._job.core.status if self._done.is_set() else RunStatus.RUNNING

    def outcomes(self) -> tuple[RankOutcome, ...]:
        return self._job.core.outcomes()

    def wait(self, timeout: float | None = None) -> bool:
        """True once the last attempt has ended."""
        return self._done.wait(timeout)

    def elapsed(self) -> float:
        return self._job.core.elapsed()

    def pids(self) -> dict[int, int]:
        return self._job.core.pids()

    def stop(self, reason: RunStatus = RunStatus.STOPPED) -> None:
        """Stop the current attempt; no restart follows."""
        with self._lock:
            self._stopped = True
            job = self._job
        job.core.stop(reason)

    def dump_stacks(self) -> None:
        self._job.core.dump_stacks()

    def answer(self, rank: int, number: int, text: Answer) -> None:
        self._job.core.answer(rank, number, text)

    # -- the restart thread -----------------------------------------------

    def _forward(self) -> None:
        try:
            while True:
                event = self._job.core.events.get()
                if not isinstance(event, Done):
                    self.events.put(event)
                elif not self._restart():
                    break
        finally:
            self._payload = None  # a kept run must not hold its arguments' memory
            self._done.set()
            self.events.put(Done())

    def _restart(self) -> bool:
        """After an attempt ended: start the next one; False when there is none."""
        job = self._job
        spec = job.spec
        with self._lock:
            if self._stopped or job.core.status is not RunStatus.FAILED or self._payload is None:
                return False
            if spec.restart_count >= spec.max_restarts:
                return False
        self.events.put(Notice(_notice(job, spec.restart_count + 1, spec.max_restarts)))
        nxt = Job(replace(spec, restart_count=spec.restart_count + 1), self._payload)
        nxt.start()
        with self._lock:
            self._job = nxt
            self.log_dir, self.run_id = nxt.log_dir, nxt.run_id
            stopped = self._stopped
        if stopped:  # stop() came while the new attempt was starting
            nxt.core.stop(RunStatus.STOPPED)
        return True


def _notice(job: Job, restart: int, most: int) -> str:
    """One line: which restart this is, and the failure that caused it."""
    core = job.core
    cause = core.root_cause
    error = run_error(cause, core.status, core.outcomes(), job.log_dir, job.spec.timeout)
    what = short_error(error) if error is not None else "a rank failed"
    where = f"rank {cause.rank} failed" if cause is not None else "the run failed"
    return f"{where} ({what}): restarting every rank, restart {restart} of {most}"
