"""The notebook side of ``%%ddp``: session defaults, running a cell, the last run.

Contract: a ``CellRunner`` is what one kernel's magics remember: the
``%ddp_config`` defaults and the last run. ``CellRunner.run_cell`` merges the
cell's options over the defaults, validates them (``ConfigError``), builds
the cell program (``SyntaxError``, ``CellError``, ``PayloadError`` naming
the notebook name that cannot be sent), runs it on every rank and returns
rank 0's ``--out`` values and trailing expression. A failed run raises an
exception that IPython shows as a failed cell with the root-cause rank's
traceback once (``_render_traceback_``), not the local nbddp frames that
re-raised it; an interrupt stops every rank and raises ``KeyboardInterrupt``.

Nothing here imports IPython: ``magics`` parses arguments and hands over.
"""

from __future__ import annotations

import builtins
import time
import traceback
from collections.abc import Iterable, Mapping
from typing import Any

import cloudpickle

from nbddp.errors import CellError, PayloadError, WorkerError
from nbddp.launcher.config import LaunchConfig
from nbddp.launcher.entry import start_run
from nbddp.launcher.run import Run, describe_exit, latest_run
from nbddp.notebook.cell import CellProgram, CellValues
from nbddp.wire.payload import find_unpicklable, short_error
from nbddp.wire.protocol import ErrorInfo

OUTPUTS = ("all", "rank0", "none")
"""Choices of ``--output``."""

# IPython shows these its own way, ignoring ``_render_traceback_``.
_NOT_RENDERED: tuple[type[BaseException], ...] = (
    SyntaxError,
    *((builtins.BaseExceptionGroup,) if hasattr(builtins, "BaseExceptionGroup") else ()),
)


def merge_options(defaults: Mapping[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
    """``given`` over ``defaults``; a cell's ``--gpus``/``--procs`` replaces both, env merges."""
    merged = dict(defaults)
    if "gpus" in given or "procs" in given:
        merged.pop("gpus", None)
        merged.pop("procs", None)
    for key, value in given.items():
        merged[key] = {**merged.get("env", {}), **value} if key == "env" else value
    return merged


def build_config(options: Mapping[str, Any], *, init: bool) -> LaunchConfig:
    """The validated launch config of ``options`` (``LaunchConfig.build`` keywords + output)."""
    kwargs = {key: value for key, value in options.items() if key != "output"}
    return LaunchConfig.build(**kwargs, init_process_group=init)


def format_options(options: Mapping[str, Any]) -> str:
    """``options`` as the command line that would give them."""
    parts: list[str] = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if key == "env":
            parts += [f"{flag} {name}={val}" for name, val in value.items()]
        elif key == "gpus" and not isinstance(value, int):
            parts.append(f"{flag} {','.join(map(str, value))},")
        else:
            parts.append(f"{flag} {value:g}" if isinstance(value, float) else f"{flag} {value}")
    return " ".join(parts)


class CellRunner:
    """One kernel's ``%%ddp`` state (see module contract)."""

    def __init__(self) -> None:
        self.defaults: dict[str, Any] = {}
        """Options given with ``%ddp_config``, as ``LaunchConfig.build`` keywords + output."""
        self.last_run: Run | None = None
        """The most recent ``%%ddp`` run (running, or ended)."""

    def configure(self, given: Mapping[str, Any], *, reset: bool = False) -> None:
        """Merge ``given`` into the defaults (after ``reset``, replace them); validate first."""
        options = merge_options({} if reset else self.defaults, given)
        build_config(options, init=True)
        self.defaults = options

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
        given: Mapping[str, Any],
        out: Iterable[str],
        init: bool,
        user_ns: Mapping[str, Any],
        hidden: Iterable[str] = (),
    ) -> tuple[dict[str, Any], Any]:
        """Run the cell on every rank; (``--out`` values, last value) from rank 0."""
        options = merge_options(self.defaults, given)
        output = options.get("output", "all")
        config = build_config(options, init=init)
        try:
            program = CellProgram.build(
                source,
                header=header,
                filename=filename,
                user_ns=user_ns,
                hidden=hidden,
                out=out,
            )
        except SyntaxError as exc:
            # Shown as Python shows it (file, line, caret), without the
            # local frames IPython would list for a SyntaxError raised here.
            shown = "".join(traceback.format_exception_only(type(exc), exc)).rstrip("\n")
            raise _rendered(CellError(shown), shown.split("\n")) from None
        try:
            run = start_run(config, program, (), {}, output)
        except PayloadError as exc:
            raise _rendered(PayloadError(_explain_names(program.names) or str(exc))) from None
        except KeyboardInterrupt:
            # Job.start stops the ranks it had started before re-raising.
            message = "KeyboardInterrupt: interrupted while the ranks were starting; none was left"
            raise _rendered(KeyboardInterrupt(), [message]) from None
        self.last_run = run
        return _finish(run)

    def status(self, *, stacks: bool = False) -> str:
        """The latest run (a %%ddp cell's, or a launch's): its state, elapsed time, each
        rank's state and exit, its logs. ``stacks``: first ask its running ranks to dump
        their Python stacks into their output."""
        run = latest_run() or self.last_run
        if run is None:
            return "%ddp_status: no run has started in this kernel yet"
        note = ""
        if stacks:
            if run.job.done.is_set():
                note = "\n(--stacks: the run has ended; no stacks to dump)"
            else:
                run.dump_stacks()
                note = "\nstacks requested: each running rank writes them to its output and log"
        job, config = run.job, run.job.config
        elapsed = (job.ended_at or time.monotonic()) - job.started_at
        lines = [
            f"latest run: {run.status} after {elapsed:.1f}s; {config.world_size} ranks "
            f"({config.device}, {config.backend}, {config.start_method}); run id {job.run_id}"
        ]
        for state in job.ranks:
            ended = describe_exit(state.exit_code) if state.exited else "still running"
            lines.append(f"  rank {state.rank}: {state.state:<8} pid {state.pid}  {ended}")
        lines.append(f"log dir: {run.log_dir}")
        return "\n".join(lines) + note


def _finish(run: Run) -> tuple[dict[str, Any], Any]:
    failure: BaseException | None = None
    values: Any = None
    try:
        values = run.wait().values.get(0)
    except KeyboardInterrupt:
        failure = _rendered(
            KeyboardInterrupt(),
            [f"KeyboardInterrupt: every rank was stopped; their output is in {run.log_dir}"],
        )
    except Exception as exc:
        failure = presentable(exc, run)
    if failure is not None:
        # Raised here, outside the except blocks, so that the error carries
        # no __context__ for IPython to walk (it falls back to a plain local
        # traceback when a context is an exception group).
        raise failure
    if not isinstance(values, CellValues):
        return {}, None
    return values.restore()


def presentable(exc: BaseException, run: Run) -> BaseException:
    """``exc`` (a run's failure) made to show as the failing rank's traceback, once.

    The lines are the rank's own traceback (formatted in the rank, so they
    show the cell's lines), then which rank it was, which other ranks failed,
    and where the full log is. Exceptions IPython would not render this way
    (syntax errors, exception groups) are replaced by a ``WorkerError``.
    """
    failure = run.job.failure
    info = failure.error if failure is not None else None
    if failure is None or info is None:
        return _rendered(exc, [f"{type(exc).__name__}: {exc}"])
    rank = failure.rank
    lines = info.traceback.rstrip("\n").split("\n")
    others = _other_failures(run, rank, info)
    also = f"; also failed: {', '.join(others)}" if others else ""
    lines.append(
        f"(raised on rank {rank} of {run.job.config.world_size}{also}; "
        f"full output in {run.log_dir / f'rank{rank}.log'})"
    )
    if isinstance(exc, _NOT_RENDERED):
        exc = WorkerError(
            f"rank {rank} raised {info.type_name}: {info.message}",
            rank=rank,
            remote_type=info.type_name,
            remote_traceback=info.traceback,
            log_path=str(run.log_dir / f"rank{rank}.log"),
        )
    return _rendered(exc, lines)


def _other_failures(run: Run, root: int, info: ErrorInfo) -> list[str]:
    """The other failed ranks, each with its error unless it is the root cause's."""
    found: list[str] = []
    for state in run.job.ranks:
        if state.rank == root or state.state != "failed":
            continue
        error = state.error
        if error is None:
            found.append(f"rank {state.rank} ({describe_exit(state.exit_code)})")
        elif (error.type_name, error.message) == (info.type_name, info.message):
            found.append(f"rank {state.rank} (the same error)")
        else:
            name = error.type_name.rpartition(".")[2]
            found.append(f"rank {state.rank} ({name}: {error.message})")
    return found


def _rendered(exc: BaseException, lines: list[str] | None = None) -> BaseException:
    """``exc`` with IPython's ``_render_traceback_`` hook showing ``lines`` (default: one line)."""
    shown = lines if lines is not None else [f"{type(exc).__name__}: {exc}"]
    try:
        # IPython calls exc._render_traceback_() instead of formatting the
        # local traceback (the hook ipyparallel uses for remote errors).
        exc._render_traceback_ = lambda: list(shown)  # type: ignore[attr-defined]
    except AttributeError:  # an exception type without instance attributes
        fallback = WorkerError(
            str(exc), rank=-1, remote_type=type(exc).__qualname__, remote_traceback="\n".join(shown)
        )
        fallback._render_traceback_ = lambda: list(shown)  # type: ignore[attr-defined]
        return fallback
    return exc


def _explain_names(names: Mapping[str, Any]) -> str | None:
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
