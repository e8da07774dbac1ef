"""The notebook side of ``%%ddp``: session defaults, running a cell, the last run.

A ``CellRunner`` is one kernel's magics' memory: the ``%ddp_config`` defaults and the last run.
``run_cell`` merges the cell's options over the defaults, validates them (``ConfigError``), builds
the cell program (``SyntaxError``, ``CellError``, ``PayloadError``), runs it and returns rank 0's
``--out`` values and trailing expression; a failure shows as the root-cause rank's traceback, an
interrupt as one line. Nothing here imports IPython.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import traceback
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import cloudpickle

from nbddp.entry import start_run
from nbddp.errors import CellError, PayloadError, SessionError
from nbddp.launcher import failures
from nbddp.launcher.config import LaunchConfig
from nbddp.launcher.failures import describe_exit, rendered
from nbddp.launcher.logs import rank_log, read_rank_log
from nbddp.launcher.options import LaunchOptions, format_options, merge_options
from nbddp.launcher.run import Run, latest_logs, latest_run
from nbddp.notebook.program import build_program
from nbddp.notebook.session import PER_CELL, Session
from nbddp.rank.cell import CellValues
from nbddp.wire.payload import find_unpicklable, short_error
from nbddp.wire.sources import cell_name

_DRAWN_OVER = re.compile(r"[^\r\n]*\r+(?=[^\r\n])")


@dataclass(frozen=True)
class CellName:
    """What a ``%%ddp`` cell's code is called."""

    filename: str
    """Its filename (``<ddp cell [6]>``), the key of its lines in ``linecache``."""
    shown: str | None
    """What tracebacks call it, as IPython calls the cell (``Cell In[6]``); None: not
    known (the magic was not run from a cell)."""


_CELL_NUMBER = re.compile(r"\[(\d+)\]")


def notebook_cell(shell: Any) -> CellName:
    """The name of the cell of ``shell`` running ``%%ddp`` (``<ddp cell [6]>``, ``Cell In[6]``)."""
    # Not ``shell.execution_count``: IPython versions differ by one on when it counts.
    frame = inspect.currentframe()
    while frame is not None:
        shown = cell_name(frame.f_code.co_filename, shell)
        number = _CELL_NUMBER.search(shown) if shown is not None else None
        if number is not None:
            return CellName(f"<ddp cell [{number.group(1)}]>", shown)
        frame = frame.f_back
    return CellName(f"<ddp cell [{shell.execution_count}]>", None)


def build_config(options: LaunchOptions, *, init: bool) -> LaunchConfig:
    """The validated launch config of ``options``; ``init``: the cell's process group."""
    with_init: LaunchOptions = {**options, "init_process_group": init}
    return LaunchConfig.build(**with_init)


class CellRunner:
    """One kernel's ``%%ddp`` state."""

    def __init__(self) -> None:
        self.defaults: LaunchOptions = {}
        """Options given with ``%ddp_config``."""
        self.defaults_config: LaunchConfig | None = None
        """The config ``defaults`` were validated into (None while there are none): a cell that
        adds no option runs with it (devices and pool settings as ``%ddp_config`` resolved them)."""
        self.last_run: Run | None = None
        """The most recent ``%%ddp`` run (running, or ended)."""
        self.session: Session | None = None
        """The kernel's session, from ``%ddp_session start`` until ``%ddp_session stop``:
        while there is one, ``%%ddp`` cells run in it."""

    def configure(self, given: LaunchOptions, *, reset: bool = False) -> None:
        """Merge ``given`` into the defaults (after ``reset``, replace them); validate first."""
        options = merge_options({} if reset else self.defaults, given)
        config = build_config(options, init=True) if options else None
        self.defaults, self.defaults_config = options, config

    def cell_config(self, given: LaunchOptions, *, init: bool) -> LaunchConfig:
        """The config of a cell with options ``given``: the defaults' own when it adds none."""
        kept = self.defaults_config
        if given or kept is None:
            return build_config(merge_options(self.defaults, given), init=init)
        if kept.job.init_process_group == init:
            return kept
        return dataclasses.replace(kept, job=dataclasses.replace(kept.job, init_process_group=init))

    def describe_defaults(self) -> str:
        """The defaults as a ``%ddp_config`` line, or what applies when there are none."""
        if not self.defaults:
            return (
                "%ddp_config: no session defaults; a %%ddp cell without --gpus/--procs "
                "uses every visible GPU, or 2 CPU processes when none is visible"
            )
        return f"%ddp_config {format_options(self.defaults)}"

    def run_cell(
        self,
        source: str,
        *,
        header: str,
        filename: str,
        given: LaunchOptions,
        out: Iterable[str],
        init: bool,
        user_ns: Mapping[str, object],
        hidden: Iterable[str] = (),
        shown: str | None = None,
    ) -> tuple[dict[str, object], Any]:
        """Run the cell on every rank (the session's while one runs); (``--out`` values,
        last value) from rank 0. ``shown``: what tracebacks call the cell."""
        session = self.session
        if session is not None:
            config = self.session_cell_config(session, given, init=init)
        else:
            config = self.cell_config(given, init=init)
        make = session.cell_program if session is not None else build_program
        try:
            program = make(
                source, header=header, filename=filename, user_ns=user_ns, hidden=hidden, out=out
            )
        except SyntaxError as exc:
            # Shown as IPython shows one (cell, line, caret), without the
            # local frames IPython would list for a SyntaxError raised here.
            text = "".join(traceback.format_exception_only(type(exc), exc)).rstrip("\n")
            if shown is not None:
                text = text.replace(f'File "{filename}", line ', f"{shown}, line ", 1)
            raise rendered(CellError(text), text.split("\n")) from None
        if shown is not None:
            program = dataclasses.replace(program, shown=shown)
        try:
            if session is not None:
                run = session.run_call(program, (), {}, config)
            else:
                run = start_run(config, program, (), {})
        except PayloadError as exc:
            raise rendered(PayloadError(_explain_names(program.names) or str(exc))) from None
        except KeyboardInterrupt:
            # Job.start stops the ranks it had started before re-raising.
            raise failures.interrupted(None) from None
        self.last_run = run
        return _finish(run, session)

    def session_cell_config(
        self, session: Session, given: LaunchOptions, *, init: bool
    ) -> LaunchConfig:
        """The session's config with the cell's timeout and output; others must match it."""
        if not init:
            raise CellError(
                "%%ddp --no-init: a session's ranks keep the process group they started "
                "with; drop --no-init, or %ddp_session stop to run one-shot cells"
            )
        if not session.alive:
            raise CellError(f"%%ddp: {session.lost_message()}")
        clash = {
            name: value
            for name, value in given.items()
            if name not in PER_CELL and session.options.get(name) != value
        }
        if clash:
            theirs = format_options(cast(LaunchOptions, clash))
            raise CellError(
                f"%%ddp {theirs}: this cell's options differ from the session's "
                f"({format_options(session.options) or 'the defaults'}); drop them (the "
                "session's apply), or %ddp_session stop to run one-shot cells"
            )
        per_cell = {name: value for name, value in given.items() if name in PER_CELL}
        return build_config(merge_options(self.defaults, cast(LaunchOptions, per_cell)), init=True)

    def start_session(self, given: LaunchOptions) -> str:
        """``%ddp_session start``: the session's options are the defaults plus ``given``."""
        if self.session is not None and self.session.alive:
            raise CellError(
                "%ddp_session start: a session is already running; %ddp_session restart "
                "starts fresh ranks, %ddp_session stop ends it"
            )
        options = merge_options(self.defaults, given)
        config = build_config(options, init=True)
        session = Session(options, config)
        try:
            session.start()
        except KeyboardInterrupt:
            raise failures.interrupted(None) from None
        except Exception as exc:
            notes = getattr(exc, "__notes__", ())
            raise rendered(exc, [f"{type(exc).__name__}: {exc}", *notes]) from None
        self.session = session
        return self.describe_session()

    def stop_session(self) -> str:
        """``%ddp_session stop``: end the ranks; ``%%ddp`` cells are one-shot again."""
        session = self._session_or_raise("stop")
        self.session = None
        session.stop()
        return "%ddp_session: stopped; %%ddp cells start fresh ranks again"

    def restart_session(self) -> str:
        """``%ddp_session restart``: fresh ranks with the same options."""
        session = self._session_or_raise("restart")
        session.restart()
        return self.describe_session()

    def debug_session(self, rank: int | None) -> None:
        """``%ddp_debug [--rank N]``: pdb where the session's last cell raised."""
        if self.session is None:
            raise CellError(
                "%ddp_debug: no session is running (a one-shot run's ranks are gone once it "
                "fails); run the cell with %%ddp --debug to debug where it raises"
            )
        try:
            self.session.debug(rank)
        except SessionError as exc:
            raise CellError(f"%ddp_debug: {exc}") from None

    def describe_session(self) -> str:
        """``%ddp_session``: the session's ranks, or that there is none."""
        if self.session is None:
            return "%ddp_session: no session; %ddp_session start [options] starts one"
        return self.session.describe()

    def _session_or_raise(self, verb: str) -> Session:
        if self.session is None:
            raise CellError(
                f"%ddp_session {verb}: no session is running; %ddp_session start [options] "
                "starts one"
            )
        return self.session

    def status(self, *, stacks: bool = False) -> str:
        """The latest run's state, ranks and logs; ``stacks``: first ask ranks for theirs."""
        run = latest_run() or self.last_run
        if run is None:
            return "%ddp_status: no run has started in this kernel yet"
        note = ""
        if stacks:
            if run.ended():
                note = "\n(--stacks: the run has ended; no stacks to dump)"
            else:
                run.dump_stacks()
                note = "\nstacks requested: each running rank writes them to its output and log"
        spec = run.config.job
        lines = [
            f"latest run: {run.status} after {run.elapsed:.1f}s; {spec.world_size} ranks "
            f"({spec.device}, {spec.backend}, {spec.start_method}); run id {run.run_id}"
        ]
        for o in run.outcomes():
            ended = describe_exit(o.exit_code) if o.exited else "still running"
            lines.append(f"  rank {o.rank}: {o.state:<8} pid {o.pid}  {ended}")
        lines.append(f"log dir: {run.log_dir}")
        return "\n".join(lines) + note

    def rank_log(self, rank: int, tail: int | None) -> RankLog:
        """``rank``'s log (or its last ``tail`` lines), the session's or the latest run's;
        else ``CellError`` saying what is wrong."""
        session = self.session
        if session is not None and session.alive and session.log_dir is not None:
            what, log_dir = "the session", session.log_dir
            world = session.config.job.world_size
        else:
            latest = latest_logs()
            if latest is None:
                raise CellError("%ddp_log: no run has started in this kernel yet")
            what, (log_dir, world) = "the latest run", latest
        if not 0 <= rank < world:
            raise CellError(f"%ddp_log: rank {rank}: {what}'s ranks are 0 to {world - 1}")
        if tail is not None and tail < 0:
            raise CellError(f"%ddp_log: --tail {tail}: give a number of lines, 0 or more")
        # A line redrawn after "\r" (a progress bar) shows its last drawing, as a terminal does.
        text = _DRAWN_OVER.sub("", read_rank_log(log_dir, rank, world, tail)).replace("\r\n", "\n")
        cut = tail is not None and len(text.splitlines()) >= tail
        return RankLog(rank, what, rank_log(log_dir, rank), tail if cut else None, text)


@dataclass(frozen=True)
class RankLog:
    """What ``%ddp_log`` shows: a rank's log, whose, where, and how much of it."""

    rank: int
    of: str
    """Whose: ``the session`` or ``the latest run``."""
    path: Path
    tail: int | None
    """How many last lines ``text`` is; None: all of the log."""
    text: str

    def title(self) -> str:
        """``rank 1 of the latest run (last 20 lines): <path>``."""
        some = "" if self.tail is None else f" (last {self.tail:,} lines)"
        return f"rank {self.rank} of {self.of}{some}: {self.path}"


def _finish(run: Run, session: Session | None = None) -> tuple[dict[str, object], Any]:
    failure: BaseException | None = None
    values: Any = None
    try:
        values = run.wait().values.get(0)
    except (KeyboardInterrupt, Exception) as exc:
        # A rank's own KeyboardInterrupt is shown as any rank's error, with its message.
        if isinstance(exc, KeyboardInterrupt) and not failures.by_a_rank(exc):
            failure = rendered(KeyboardInterrupt(), [_interrupted(run, session)])
        else:
            after = [session.state_note()] if session is not None else []
            failure = failures.presentable(exc, run.root_cause, run.outcomes(), run.log_dir, after)
    if session is not None:
        session.record_failures(run)
    if failure is not None:
        # Raised outside the except blocks: no __context__ for IPython to walk.
        raise failure
    return values.restore() if isinstance(values, CellValues) else ({}, None)


def _interrupted(run: Run, session: Session | None) -> str:
    if session is None:
        return failures.interrupted_line(run.log_dir)
    if session.alive:
        return f"KeyboardInterrupt: the cell was interrupted on every rank {session.state_note()}"
    return f"KeyboardInterrupt: {session.lost_message()}"


def _explain_names(names: Mapping[str, object]) -> str | None:
    """Which notebook name the cell reads cannot be sent, and what to do; None if all can."""
    for name, value in names.items():
        path = find_unpicklable(value, [f"the notebook name {name!r}"], set(), depth=0)
        if path is None:
            continue
        try:
            cloudpickle.dumps(value)
            reason = ""
        except Exception as exc:
            reason = f" ({short_error(exc)})"
        return (
            f"cannot send {' -> '.join(path[:-1])}, which the cell reads, to the workers: "
            f"{path[-1]} cannot be pickled{reason}. Create it inside the cell instead, "
            "or keep in the notebook only what is needed to build it (a path, a config)."
        )
    return None
