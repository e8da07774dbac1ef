"""Sessions (``Session``): ranks that live across calls and ``%%ddp`` cells, keeping their state.

Options are validated as ``launch()`` does. Calls (``run``, ``exec``, ``run_call``) go one at a
time, each with its own display, value and error. A name a cell bound on the ranks is theirs and
never sent again (``names``); every other name a cell reads is the notebook's, sent each time.
"""

from __future__ import annotations

import dataclasses
import os
import time
import weakref
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from nbddp.entry import guarded, make_display
from nbddp.errors import ConfigError, SessionError
from nbddp.launcher.cells import Cells
from nbddp.launcher.config import LaunchConfig
from nbddp.launcher.failures import describe_exit
from nbddp.launcher.job import Job
from nbddp.launcher.options import LaunchOptions, format_options
from nbddp.launcher.pump import Display
from nbddp.launcher.run import Run
from nbddp.notebook.program import build_program, definitions_read
from nbddp.rank import session_loop as rank_session
from nbddp.rank.cell import CellProgram, CellValues
from nbddp.wire.payload import Args, Fn, Kwargs, Payload

if TYPE_CHECKING:
    from typing_extensions import Unpack


PER_CELL = frozenset({"timeout", "output", "tail", "debug"})
"""Options a session's cell may set for itself; the others are the session's."""
END_WAIT = 10.0  # seconds ranks get to leave their loop before they are stopped


class Session:
    """Ranks that keep their state from call to call (``nbddp.session(...)`` makes one).

    ``run(fn, *args)`` calls ``fn`` on every rank and returns rank 0's value; ``exec(source,
    names)`` runs ``source`` as a ``%%ddp`` cell; ``restart()`` starts fresh ranks with the same
    options, ``stop()`` ends them, and ``describe()`` shows each rank. A failed call keeps the
    state when every rank returned to idle; otherwise its error says the session ended (``alive``
    is False). A context manager that stops on exit.
    """

    def __init__(self, options: LaunchOptions, config: LaunchConfig | None = None) -> None:
        if options.get("max_restarts"):
            raise ConfigError(
                "max_restarts does not apply to a session (its state would be lost at "
                "each restart); use it with one-shot runs"
            )
        self.options: LaunchOptions = options
        """The options the session was started with."""
        built = config or LaunchConfig.build(**options)
        job = dataclasses.replace(built.job, init_process_group=True, timeout=None)
        self.config = dataclasses.replace(built, job=job)
        """Its validated config (a cell's timeout is the cell's own)."""
        self._cell_config = built
        self._job: Cells | None = None
        self._started_at = 0.0
        self._definitions_read: set[str] = set()
        self._raised: tuple[int, ...] = ()  # ranks that raised in the last cell, cause first
        self._finalizer: weakref.finalize[[Cells], Session] | None = None

    # -- life ---------------------------------------------------------------

    def start(self) -> Session:
        """Start the ranks; return once each is idle with its process group
        (a failure to start raises as a launch does, and leaves nothing)."""
        if self.alive:
            raise SessionError("the session is already running; stop() or restart() it")
        job = self._new_job(Payload.serialize(rank_session.serve_session_rank, (), {}))
        self._definitions_read = set()
        self._raised = ()
        job.start()
        self._job, self._started_at = job, time.monotonic()
        # A session dropped without stop() (a kernel's magics reloaded, a script's
        # end) still ends its ranks: they would otherwise idle until the kernel exits.
        self._finalizer = weakref.finalize(self, _end_job, job, os.getpid())
        try:
            Run(job.ready, None, self.config).wait()
        except BaseException:
            self._job = None
            self._finalizer.detach()
            job.core.stop()
            job.core.wait(job.spec.kill_grace + 5.0)
            raise
        return self

    def _new_job(self, payload: Payload) -> Cells:
        if self.config.cluster is None:
            return Cells(Job(self.config.job, payload, session=True))
        from nbddp.cluster.client import ClusterJob  # imports ray: only on a cluster

        return Cells(ClusterJob(self.config, payload, session=True))

    def stop(self) -> None:
        """End the ranks (no-op if the session has ended). Idle ranks are asked to
        leave and exit as a finished run does; ranks in a cell are stopped."""
        job, self._job = self._job, None
        if job is None:
            return
        if self._finalizer is not None:
            self._finalizer.detach()
        _end_job(job)

    def restart(self) -> Session:
        """Stop, then start fresh ranks with the same options."""
        self.stop()
        return self.start()

    def __enter__(self) -> Session:
        if not self.alive:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def alive(self) -> bool:
        """True while the ranks run (idle or in a cell)."""
        return self._job is not None and self._job.alive

    @property
    def pids(self) -> dict[int, int]:
        """Rank -> pid of the session's ranks (empty without a session)."""
        return self._job.core.pids() if self._job is not None else {}

    @property
    def names(self) -> tuple[str, ...]:
        """The names that belong to the ranks (bound by session cells, on rank 0)."""
        return self._job.names if self._job is not None else ()

    @property
    def log_dir(self) -> Path | None:
        """The session's log directory (a log per rank, a marker line per cell)."""
        return self._job.log_dir if self._job is not None else None

    # -- calls ---------------------------------------------------------------

    def run(self, fn: Fn, *args: object, **kwargs: object) -> Any:
        """Call ``fn(*args, **kwargs)`` on every rank; rank 0's value."""
        run = self.run_call(fn, args, kwargs, self._cell_config)
        return self.finish(run).values.get(0)

    def exec(
        self, source: str, names: Mapping[str, object] | None = None, *, out: Iterable[str] = ()
    ) -> Any:
        """Run ``source`` on every rank as a ``%%ddp`` cell; rank 0's last expression. ``names``:
        values the cell may read (the ranks' own names win)."""
        job = self._job_or_raise()
        program = self.cell_program(
            source,
            header="# nbddp session",
            filename=f"<ddp session cell {job.cells_run + 1}>",
            user_ns=names or {},
            out=out,
        )
        values = self.finish(self.run_call(program, (), {}, self._cell_config)).values.get(0)
        return values.restore()[1] if isinstance(values, CellValues) else None

    def cell_program(
        self,
        source: str,
        *,
        header: str,
        filename: str,
        user_ns: Mapping[str, object],
        hidden: Iterable[str] = (),
        out: Iterable[str] = (),
    ) -> CellProgram:
        """The program for a cell of this session: it sends the names the cell and earlier
        cells' functions read, never the ranks' own (``names``) nor ``hidden``."""
        program = build_program(
            source,
            header=header,
            filename=filename,
            user_ns=user_ns,
            hidden=(*hidden, *self.names),
            out=out,
            session=True,
            also=self._definitions_read,
        )
        self._definitions_read |= definitions_read(source)  # valid: it compiled
        return program

    def run_call(
        self,
        fn: Fn,
        args: Args,
        kwargs: Kwargs,
        config: LaunchConfig,
        display: Display | None = None,
    ) -> Run:
        """Start ``fn(*args, **kwargs)`` as the next cell with ``config``'s timeout; its ``Run``."""
        job = self._job_or_raise()
        timeout = config.job.timeout
        cell_config = dataclasses.replace(
            self.config, job=dataclasses.replace(self.config.job, timeout=timeout), view=config.view
        )
        payload = Payload.serialize(fn, args, kwargs)
        shown = guarded(display, config.view) if display is not None else make_display(config.view)
        return Run(job.cell(payload, timeout, config.job.debug), shown, cell_config)

    def finish(self, run: Run) -> Any:
        """Wait for ``run`` (a cell of this session); its result, or its failure raised."""
        try:
            return run.wait()
        except BaseException as exc:
            if not isinstance(exc, KeyboardInterrupt) and hasattr(exc, "add_note"):
                exc.add_note(self.state_note())
            raise
        finally:
            self.record_failures(run)

    def record_failures(self, run: Run) -> None:
        """Remember which ranks raised in ``run``, the root cause first, for ``debug``."""
        cause = run.root_cause
        raised = [o.rank for o in run.outcomes() if o.error is not None]
        if cause is not None and cause.rank in raised:
            raised.remove(cause.rank)
            raised.insert(0, cause.rank)
        self._raised = tuple(raised)

    def debug(self, rank: int | None = None) -> None:
        """Open pdb in the cell where the last cell raised, on ``rank`` (default: the
        rank that failed first), as IPython's ``%debug`` does; the state is kept."""
        self._job_or_raise()
        if not self._raised:
            raise SessionError(
                "nothing to debug: the last cell of the session did not raise on any rank"
            )
        if rank is None:
            rank = self._raised[0]
        elif rank not in self._raised:
            raise SessionError(
                f"rank {rank} did not raise in the last cell; ranks that did: "
                f"{', '.join(map(str, sorted(self._raised)))}"
            )
        # Not ``finish``: looking at a failure does not replace it.
        self.run_call(rank_session.DebugLast(rank), (), {}, self._cell_config).wait()

    def state_note(self) -> str:
        """After a failed call: that the session keeps its state, or why it ended."""
        job = self._job
        if job is None or not job.alive:
            return self.lost_message()
        return f"({job.note or 'every rank returned to idle: the session keeps its state'})"

    def lost_message(self) -> str:
        """What ended the session, that its state is lost, and what to do (may wait, bounded)."""
        return (
            f"the session has ended ({self._why_ended()}); the ranks' state is lost. "
            "%ddp_session restart (or Session.restart()) starts fresh ranks with the same options"
        )

    def _why_ended(self) -> str:
        job = self._job
        if job is not None and job.lost is None and not job.alive:
            job.core.wait(job.spec.kill_grace + END_WAIT)
        return job.lost if job is not None and job.lost else "it was stopped"

    def _job_or_raise(self) -> Cells:
        job = self._job
        if job is None:
            raise SessionError("no session is running; start one first (%ddp_session start)")
        if not job.alive:
            raise SessionError(self.lost_message())
        return job

    # -- what it is ----------------------------------------------------------

    def describe(self) -> str:
        """The session as a few lines: options, and per rank its state, pid, uptime,
        resident memory and device memory; the names on rank 0."""
        job = self._job
        if job is None:
            return "no session (start one with %ddp_session start [options])"
        status = "running" if job.alive else f"ended ({self._why_ended()})"
        options = format_options(self.options) or "(defaults)"
        placements = getattr(job.transport, "nodes", None)  # on a cluster: each node's ranks
        nodes = {r: f"{p.node_rank} {p.address}" for p in placements or () for r in p.global_ranks}
        width = max([len("node"), *map(len, nodes.values())]) if placements is not None else 0
        node_column = f"{'node':<{width}}  " if width else ""
        lines = [
            f"session: {status}; {job.spec.world_size} ranks ({job.spec.device}, "
            f"{job.spec.backend}); options {options}; {job.cells_run} cells run",
            f"{'rank':>4}  {node_column}{'pid':>7}  {'uptime':>8}  {'memory':>9}  "
            f"{'device':>9}  state",
        ]
        busy = job.busy_ranks()
        for o in job.core.outcomes():
            state = "busy" if o.rank in busy else "idle"
            if o.exited:
                state = describe_exit(o.exit_code)
            device = job.device_bytes.get(o.rank)
            shown = _mib(device) if device is not None else "-"
            node = f"{nodes.get(o.rank, '?'):<{width}}  " if width else ""
            memory = _rss(o.pid) if not width else "-"  # another machine's pid
            lines.append(
                f"{o.rank:>4}  {node}{o.pid or 0:>7}  "
                f"{time.monotonic() - self._started_at:>7.0f}s  {memory:>9}  {shown:>9}  {state}"
            )
        if width:
            from nbddp.cluster import agents

            lines.append(f"agents: {agents.describe()}")
        names = ", ".join(self.names) or "(none yet)"
        lines.append(f"names on rank 0: {names}")
        lines.append(f"log dir: {job.log_dir}")
        return "\n".join(lines)


def _end_job(job: Cells, owner: int | None = None) -> None:
    core = job.core
    if core.wait(0) or owner not in (None, os.getpid()):  # at a forked child's exit: not its
        return
    if not job.busy_ranks():  # idle ranks are asked to leave first
        job.end()
        if core.wait(END_WAIT):
            return
    core.stop()
    core.wait(job.spec.kill_grace + 5.0)


def _rss(pid: int | None) -> str:
    if pid is None:
        return "-"
    try:
        return _mib(psutil.Process(pid).memory_info().rss)
    except psutil.Error:
        return "-"


def _mib(size: int) -> str:
    return f"{size / (1 << 20):.0f} MiB"


def session(**options: Unpack[LaunchOptions]) -> Session:
    """Start a session with ``launch()``'s options: ranks that keep their state
    (``with nbddp.session(procs=2) as s: s.run(fn, *args)``; see ``Session``)."""
    return Session(options).start()
