"""IPython magics: ``%%ddp``, ``%ddp_config``, ``%ddp_session``, ``%ddp_debug``,
``%ddp_status``, ``%ddp_panel``.

The magics only parse their arguments (flags and help from ``options.LaunchOptions``) and hand over
to the kernel's ``CellRunner``. Bad options and an empty cell raise a one-line ``UsageError``;
nothing on a magic line is evaluated as Python. ``%reload_ext nbddp`` starts afresh.
"""

from __future__ import annotations

import argparse
import contextlib
import html
import shlex
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, cast

from IPython.core import magic_arguments as _ma
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.core.magic import Magics, magics_class
from IPython.core.magic import cell_magic as _cell_magic
from IPython.core.magic import line_magic as _line_magic

from nbddp.display.blocks import path_html
from nbddp.errors import CellError, ConfigError
from nbddp.launcher.options import OPTIONS, LaunchOptions, Option, magic_options, merge_options
from nbddp.launcher.spelling import FLAGS, close_options
from nbddp.notebook.runner import CellRunner, RankLog, notebook_cell

F = TypeVar("F", bound=Callable[..., object])


# Typed faces of IPython's (unannotated) magic_arguments decorators.
def argument(*args: object, **kwargs: object) -> Callable[[F], F]:
    """``magic_arguments.argument``: one ``add_argument`` call."""
    return cast(Callable[[F], F], _ma.argument(*args, **kwargs))  # type: ignore[no-untyped-call]


def argument_group(title: str) -> Callable[[F], F]:
    """``magic_arguments.argument_group``: the options after it go in this group."""
    return cast(Callable[[F], F], _ma.argument_group(title))  # type: ignore[no-untyped-call]


def cell_magic(func: F) -> F:
    """``magic.cell_magic``: register ``func`` as a cell magic of its class."""
    return cast(F, _cell_magic(func))


def line_magic(func: F) -> F:
    """``magic.line_magic``: register ``func`` as a line magic of its class."""
    return cast(F, _line_magic(func))


def magic_arguments(name: str | None = None) -> Callable[[F], F]:
    """``magic_arguments.magic_arguments`` named ``name``, without abbreviations."""
    # Abbreviations are off: ``--out`` must not quietly mean ``--output``.
    build = _ma.magic_arguments(name)  # type: ignore[no-untyped-call]

    def decorate(func: F) -> F:
        func = build(func)
        func.parser.allow_abbrev = False  # type: ignore[attr-defined]
        return func

    return decorate


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if not n.isidentifier()]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"--out takes Python names separated by commas (state,history), got {text!r}"
        )
    return names


def _flag(option: Option) -> Callable[[F], F]:
    """The ``add_argument`` call of one launch option (see ``options.Magic``)."""
    magic = option.magic
    assert magic is not None
    spec: dict[str, object] = {"help": option.help}
    if magic.parse is not None:
        spec["type"] = magic.parse
    if option.choices:
        spec["choices"] = option.choices
    if magic.metavar is not None:
        spec["metavar"] = magic.metavar
    if magic.repeat:
        spec["action"] = "append"
    if magic.switch:
        # None when not given, so a cell's line says only what it sets.
        spec = {"help": option.help, "action": "store_const", "const": True, "default": None}
    return argument(option.flag, **spec)


_LAUNCH_OPTIONS = (
    argument_group("launch options (%ddp_config sets them for the session)"),
    *(_flag(option) for option in magic_options()),
)


def _launch_arguments(func: F) -> F:
    """Add the shared launch options to a magic (in the order they are defined)."""
    for decorator in reversed(_LAUNCH_OPTIONS):
        func = decorator(func)
    return func


def launch_options(args: argparse.Namespace) -> LaunchOptions:
    """The launch options given on the line (a repeated option's items as a dict)."""
    given: dict[str, object] = {}
    for option in magic_options():
        value = getattr(args, option.name)
        if value is not None:
            given[option.name] = dict(value) if option.magic and option.magic.repeat else value
    # The parser checked each flag's spelling; LaunchConfig.build checks the values.
    return cast(LaunchOptions, given)


def parse(magic: Callable[..., object], line: str, name: str) -> argparse.Namespace:
    """Parse ``line`` for ``magic``, a ``# comment`` after the options left out (as in the
    docs' examples); any problem is a one-line ``UsageError``."""
    try:
        # Split as a shell does (IPython's own split keeps quotes in the values).
        args = magic.parser.parse_args(shlex.split(line, comments=True))  # type: ignore[attr-defined]
    except UsageError as exc:
        hint = _did_you_mean(str(exc))
        raise UsageError(f"{name}: {exc}{hint} ({name}? lists the options)") from None
    except ValueError as exc:  # unbalanced quotes
        raise UsageError(f"{name}: cannot split the options: {exc}") from None
    return cast(argparse.Namespace, args)


def _did_you_mean(error: str) -> str:
    """``; did you mean --procs?`` for a flag close to a launch option's, else nothing."""
    _, found, unknown = error.partition("unrecognized arguments:")
    if not found:
        return ""
    for word in unknown.split():
        flag = word.partition("=")[0]
        if not flag.startswith("-"):
            continue
        flags = [
            OPTIONS[o].flag
            for o in close_options(flag)
            if OPTIONS[o].magic and OPTIONS[o].flag != flag
        ]
        if flags:
            return f"; did you mean {' or '.join(flags)}?"
    return ""


LOG_TAIL = 200
"""The lines ``%ddp_log`` shows unless told: enough to see the end, short enough to read."""


def show_log(shown: RankLog) -> None:
    """Display a rank's log in the cell: its title, its path and its text."""
    from IPython.display import display

    body = html.escape(shown.text)
    title = shown.title()
    path = path_html(shown.path)
    head = html.escape(title.removesuffix(str(shown.path)))
    bundle = {
        "text/plain": f"{title}\n{shown.text}".rstrip("\n"),
        "text/html": (
            f'<div style="font-family:monospace;font-weight:bold">{head}{path}</div>'
            '<pre style="margin:0;padding:2px 6px;white-space:pre-wrap;word-break:break-all">'
            f"{body}</pre>"
        ),
    }
    display(bundle, raw=True)  # type: ignore[no-untyped-call]


@contextlib.contextmanager
def _as_usage_error() -> Iterator[None]:
    # Why: a wrong option or an empty cell deserves one line, not a traceback, and
    # names the options as the magics spell them.
    try:
        with FLAGS.speaking():
            yield
    except (ConfigError, CellError) as exc:
        if hasattr(exc, "_render_traceback_"):
            raise  # a rank's own error, already made to show its traceback
        raise UsageError(str(exc)) from None


@magics_class
class DdpMagics(Magics):
    """The nbddp magics of one kernel; their state is the instance's ``session``."""

    def __init__(self, shell: InteractiveShell) -> None:
        super().__init__(shell)
        self.runner = CellRunner()

    @cell_magic
    @magic_arguments("%ddp")  # usage: %%ddp
    @argument(
        "--out",
        type=_names,
        action="append",
        metavar="NAMES",
        help="names to bring back from rank 0 into the notebook (comma-separated)",
    )
    @argument(
        "--no-init",
        action="store_true",
        help="do not initialise the default process group (the cell does it)",
    )
    @_launch_arguments
    def ddp(self, line: str, cell: str) -> Any:
        """Run this cell on every rank (one process per GPU, or per CPU slot).

        Before the cell, the default process group is initialised (nccl on GPUs, gloo on CPU) and
        rank, local_rank, world_size and device are defined. The notebook names the cell reads are
        sent to the ranks. After it, the --out names come back from rank 0 (tensors on the CPU) and
        a last expression on rank 0 is the cell's result. A rank that raises fails the cell with
        that rank's traceback.
        """
        args = parse(self.ddp, line, "%%ddp")
        shell = self.shell
        assert shell is not None
        naming = notebook_cell(shell)
        with _as_usage_error():
            out, last = self.runner.run_cell(
                cell,
                header=f"%%ddp {line}".rstrip(),
                filename=naming.filename,
                shown=naming.shown,
                given=launch_options(args),
                out=[name for names in args.out or () for name in names],
                init=not args.no_init,
                user_ns=shell.user_ns,
                hidden=shell.user_ns_hidden,
            )
        shell.push(out)  # type: ignore[no-untyped-call]
        return last

    @line_magic
    @magic_arguments()
    @argument("--reset", action="store_true", help="forget the session defaults first")
    @_launch_arguments
    def ddp_config(self, line: str) -> None:
        """Set the launch options every %%ddp cell starts from; with none, show them.

        A cell's own options win; its --gpus or --procs replaces both.
        """
        args = parse(self.ddp_config, line, "%ddp_config")
        given = launch_options(args)
        if given or args.reset:
            with _as_usage_error():
                self.runner.configure(given, reset=args.reset)
        print(self.runner.describe_defaults())

    @line_magic
    def ddp_status(self, line: str) -> None:
        """Show the latest run: its state, each rank's state and exit, time, log dir.

        --stacks: ask its running ranks to write their Python stacks (all threads)
        into their output and logs, to see where each one is stuck.
        """
        words = line.split()
        if any(word != "--stacks" for word in words):
            raise UsageError(f"%ddp_status takes only --stacks, got {line.strip()!r}")
        print(self.runner.status(stacks=bool(words)))

    @line_magic
    def ddp_session(self, line: str) -> None:
        """Ranks that live across %%ddp cells, keeping their state.

        %ddp_session start [launch options]: start the ranks (process group initialised; rank,
        local_rank, world_size, device defined); from then on every %%ddp cell runs in them, each
        rank keeping its globals. %ddp_session: show each rank (state, pid, memory) and the names on
        rank 0. %ddp_session restart: fresh ranks, same options. %ddp_session stop: end them. A name
        a session cell bound belongs to the ranks: the notebook's value of that name is never sent
        to them.
        """
        words = line if line.lstrip().startswith("start") else line.partition("#")[0]  # a comment
        verb, _, rest = words.strip().partition(" ")
        runner = self.runner
        with _as_usage_error():
            if verb == "start":
                args = parse(self._session_start, rest, "%ddp_session start")
                print(runner.start_session(launch_options(args)))
            elif verb in ("stop", "restart", "") and rest.strip():
                raise UsageError(f"%ddp_session {verb}: takes no options, got {rest.strip()!r}")
            elif verb == "stop":
                print(runner.stop_session())
            elif verb == "restart":
                print(runner.restart_session())
            elif verb == "":
                print(runner.describe_session())
            else:
                raise UsageError(
                    f"%ddp_session: unknown command {verb!r}; use start [options], stop, "
                    "restart, or nothing to show the session"
                )

    @line_magic
    @magic_arguments()
    @argument("--rank", type=int, help="the rank to debug (default: the one that failed first)")
    def ddp_debug(self, line: str) -> None:
        """Open pdb where the session's last cell raised, as %debug does for a cell.

        On the rank that failed first, or --rank N (one that raised); the
        session keeps its state. Outside a session, use %%ddp --debug.
        """
        args = parse(self.ddp_debug, line, "%ddp_debug")
        with _as_usage_error():
            self.runner.debug_session(args.rank)

    @line_magic
    @magic_arguments()
    @argument("rank", nargs="?", type=int, default=0, help="the rank whose log to show (default 0)")
    @argument(
        "--tail",
        type=int,
        metavar="N",
        default=LOG_TAIL,
        help=f"show its last N lines (default {LOG_TAIL}; --all for all of it)",
    )
    @argument("--all", action="store_true", help="show all of it")
    @argument("--help", action="store_true", help="show this help")
    def ddp_log(self, line: str) -> None:
        """Show a rank's log in the cell: the current session's while one is alive,
        else the latest run's (a %%ddp cell's or a launch's).

        A rank's log keeps everything it wrote, stdout and stderr as they arrived, and its traceback
        if it raised; a cell's blocks show only its last lines.
        """
        args = parse(self.ddp_log, line, "%ddp_log")
        if args.help:
            print(self.ddp_log.__doc__)
            return
        with _as_usage_error():
            shown = self.runner.rank_log(args.rank, None if args.all else args.tail)
        show_log(shown)

    @magic_arguments("ddp_session start")  # the help writes the leading %
    @_launch_arguments
    def _session_start(self, line: str) -> None:
        """Start a session's ranks with these launch options (over %ddp_config's)."""

    @line_magic
    @magic_arguments("ddp_panel")  # the help writes the leading %
    @argument("function", help="the name of a function in the notebook, run as FUNCTION()")
    @_launch_arguments
    def ddp_panel(self, line: str) -> Any:
        """Show a panel that launches FUNCTION() on every rank (nbddp.panel).

        The options (over the %ddp_config defaults) preset the panel's form.
        The panel is the cell's result (``p = _`` keeps it). For arguments,
        call nbddp.panel(function, *args, **kwargs) instead.
        """
        args = parse(self.ddp_panel, line, "%ddp_panel")
        shell = self.shell
        assert shell is not None
        name = args.function
        fn = shell.user_ns.get(name)
        if fn is None or not callable(fn):
            what = "no name" if fn is None else f"{type(fn).__name__}, not a function:"
            raise UsageError(f"%ddp_panel: the notebook has {what} {name!r}; define it first")
        options = merge_options(self.runner.defaults, launch_options(args))
        options.pop("output", None)
        try:
            from nbddp.notebook.panel.cells import show_panel
        except ImportError:
            raise UsageError(
                "%ddp_panel needs ipywidgets: pip install 'nbddp[panel]' (or ipywidgets)"
            ) from None
        with _as_usage_error():
            return show_panel(fn, (), {}, options)


def load_ipython_extension(shell: InteractiveShell) -> None:
    """Register the magics; a second load keeps the first (and its session)."""
    if "DdpMagics" not in shell.magics_manager.registry:
        shell.register_magics(DdpMagics(shell))


def unload_ipython_extension(shell: InteractiveShell) -> None:
    """Remove the magics and stop their session (``%reload_ext nbddp`` starts afresh)."""
    magics = shell.magics_manager.registry.pop("DdpMagics", None)
    if magics is None:
        return
    session = magics.runner.session if isinstance(magics, DdpMagics) else None
    if session is not None:
        # Its ranks would live on with nothing in the notebook left to reach them.
        magics.runner.session = None
        session.stop()
    for kind, names in magics.magics.items():
        for name in names:
            shell.magics_manager.magics[kind].pop(name, None)
