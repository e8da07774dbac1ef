"""The ``%%ddp`` cell program: what every rank runs for a cell.

A ``CellProgram`` (built by ``nbddp.notebook.program.build_program``, pickled with cloudpickle),
called in a rank, defines ``rank``, ``local_rank``, ``world_size`` and ``device``, runs the body
in a fresh namespace seeded with the notebook's names (in a session, the rank's own namespace)
and evaluates a trailing expression. Rank 0 returns ``CellValues`` (the ``--out`` names and that
value, each packed on its own; ``restore`` rebuilds them once); others return None. The source is
registered in ``linecache`` as ``Cell In[N]``. IPython syntax (``!cmd``, ``%magic``) is not run.
"""

from __future__ import annotations

import ast
import builtins
import types
from dataclasses import dataclass, field

from nbddp.errors import CellError
from nbddp.rank import context, session_loop
from nbddp.wire import sources
from nbddp.wire.descriptors import Packed
from nbddp.wire.sources import Source
from nbddp.wire.values import pack, unpack


def register_source(filename: str, text: str, shown: str | None = None) -> None:
    """Make ``text`` the source of ``filename`` for tracebacks (``linecache``), its
    frames named ``shown`` (``Cell In[6]``) when given."""
    sources.register([Source(filename, tuple(text.splitlines(keepends=True)), shown)])


def compile_cell(
    source: str, filename: str, *, quiet: bool = False
) -> tuple[types.CodeType, types.CodeType | None]:
    """The cell as (body, trailing expression or None), line 1 being the ``%%ddp`` line;
    ``SyntaxError`` for invalid code, ``CellError`` for an empty cell."""
    # The leading newline stands for the %%ddp line, so that line numbers
    # (in tracebacks and syntax errors) match the notebook's.
    tree = ast.parse("\n" + source, filename, "exec")
    if not tree.body:
        raise CellError(
            "%%ddp: the cell is empty; write the code every rank runs below the %%ddp line"
        )
    last: ast.Expression | None = None
    final = tree.body[-1]
    if isinstance(final, ast.Expr) and not quiet:
        tree.body.pop()
        last = ast.Expression(final.value)
    body = compile(tree, filename, "exec", dont_inherit=True)
    expr = compile(last, filename, "eval", dont_inherit=True) if last is not None else None
    return body, expr


@dataclass(frozen=True)
class CellValues:
    """What rank 0 sends back: each value packed on its own (``wire.values``)."""

    out: dict[str, Packed]
    """The ``--out`` names."""
    last: Packed | None = None
    """The trailing expression's value, if it pickled."""
    last_repr: str | None = None
    """Its ``repr``, when the value itself could not be pickled."""

    def restore(self) -> tuple[dict[str, object], object]:
        """(``--out`` name -> value, trailing expression's value) in the notebook."""
        out = {name: _restore(f"--out {name}", packed) for name, packed in self.out.items()}
        if self.last is not None:
            return out, _restore("the cell's last value", self.last)
        return out, _Repr(self.last_repr) if self.last_repr is not None else None


def _restore(what: str, packed: Packed) -> object:
    try:
        return unpack(packed)
    except Exception as exc:
        raise CellError(
            f"{what}: rank 0 sent it ({packed.type_name}) but it cannot be rebuilt in the "
            f"notebook ({type(exc).__name__}: {exc}); send plain data (tensors, numbers, "
            "lists, dicts, a state_dict()) or make its class importable in the notebook"
        ) from None


@dataclass(frozen=True)
class _Repr:
    """Shows a value that stayed in rank 0 by the ``repr`` it had there."""

    text: str

    def __repr__(self) -> str:
        return self.text


@dataclass(frozen=True)
class CellProgram:
    """What every rank runs for a ``%%ddp`` cell."""

    source: str
    """The cell body (without the ``%%ddp`` line)."""
    header: str
    """The ``%%ddp`` line, shown as line 1 in tracebacks."""
    filename: str
    """The name the cell's code is compiled under, e.g. ``<ddp cell [3]>``."""
    names: dict[str, object] = field(default_factory=dict)
    """The notebook names the cell reads."""
    out: tuple[str, ...] = ()
    """Names rank 0 sends back."""
    quiet: bool = False
    """The cell ends with ``;``: its last expression is not shown."""
    session: bool = False
    """Run in the rank's session namespace (``nbddp.rank.session_loop``), not a fresh one."""
    lasting: frozenset[str] = frozenset()
    """In a session: the sent names that functions the ranks keep read, left in the
    namespace after the cell (``nbddp.rank.namespace``)."""
    shown: str | None = None
    """The cell's name in tracebacks, as IPython's (``Cell In[3]``); None: ``filename``."""

    def __call__(self) -> CellValues | None:
        """Run the cell on this rank; rank 0's values, None elsewhere."""
        place = context.require()
        register_source(self.filename, self.header + "\n" + self.source, self.shown)
        body, expr = compile_cell(self.source, self.filename, quiet=self.quiet)
        given = {
            "rank": place.rank,
            "local_rank": place.local_rank,
            "world_size": place.world_size,
            "device": context.device(place),
        }
        if not self.session:
            # One dict as the globals: functions and classes the cell defines
            # see each other and the sent names, as they would in the notebook.
            ns = {"__name__": "__main__", "__builtins__": builtins, **self.names, **given}
            return self._run(body, expr, ns, place.rank)
        space = session_loop.state().space
        space.globals.update(given)
        run = lambda: self._run(body, expr, space.globals, place.rank)  # noqa: E731
        return space.call(run, self.names, self.lasting)

    def _run(
        self, body: types.CodeType, expr: types.CodeType | None, ns: dict[str, object], rank: int
    ) -> CellValues | None:
        exec(body, ns)
        value = eval(expr, ns) if expr is not None else None
        return _collect(ns, self.out, value) if rank == 0 else None


def _collect(ns: dict[str, object], out: tuple[str, ...], value: object) -> CellValues:
    missing = [name for name in out if name not in ns]
    if missing:
        raise NameError(
            f"--out {','.join(missing)}: the cell did not define "
            f"{' or '.join(repr(n) for n in missing)} on rank 0"
        )
    sent: dict[str, Packed] = {}
    for name in out:
        try:
            sent[name] = pack(ns[name])
        except Exception as exc:
            raise TypeError(
                f"--out {name}: {type(ns[name]).__name__} cannot be sent to the notebook "
                f"({type(exc).__name__}: {exc}); send plain data instead "
                "(tensors, numbers, lists, dicts, a state_dict())"
            ) from None
    if value is None:
        return CellValues(sent)
    try:
        return CellValues(sent, last=pack(value))
    except Exception:
        # The value is only for display: its repr is enough.
        return CellValues(sent, last_repr=repr(value))
