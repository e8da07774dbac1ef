"""Turning a ``%%ddp`` cell into the program every rank runs: checked here, in the notebook.

``build_program`` compiles the cell (``SyntaxError``, or ``CellError`` for an empty cell), finds
the notebook names it reads and returns the ``CellProgram`` the ranks run. The analysis is static:
a name reached only through ``eval``/``exec``/``globals()`` must be passed explicitly.
"""

from __future__ import annotations

import ast
import io
import re
import symtable
import tokenize
from collections.abc import Iterable, Iterator, Mapping

from nbddp.rank.cell import CellProgram, compile_cell, register_source

# IPython's own names (history, the shell, module dunders): never shipped.
_INTERNAL = re.compile(r"_{1,3}|_i{1,3}|_i?\d+|_[oid]h|In|Out|get_ipython|exit|quit|__\w+__")


def build_program(
    source: str,
    *,
    header: str,
    filename: str,
    user_ns: Mapping[str, object],
    hidden: Iterable[str] = (),
    out: Iterable[str] = (),
    session: bool = False,
    also: Iterable[str] = (),
) -> CellProgram:
    """The program for the cell ``source``. ``hidden``: names never sent; ``also``: names
    sent if the notebook has them and left on a session's ranks after the cell."""
    register_source(filename, header + "\n" + source)
    quiet = is_quiet(source)
    compile_cell(source, filename, quiet=quiet)  # SyntaxError / empty cell: now
    if session:
        also = {*also, *definitions_read(source)}
    names = select_names(user_ns, names_read(source) | set(also), hidden)
    lasting = frozenset(also) & names.keys() if session else frozenset()
    return CellProgram(source, header, filename, names, tuple(out), quiet, session, lasting)


def names_read(source: str) -> frozenset[str]:
    """The global names ``source`` may read from outside itself, minus those always bound
    at top level before their reads. When in doubt a name is read: one too few fails."""
    tree = ast.parse(source)
    table = symtable.symtable(source, "<ddp cell>", "exec")
    top_level = {sym.get_name() for sym in table.get_symbols()}
    read = {sym.get_name() for sym in table.get_symbols() if sym.is_referenced()}
    # ``x += 1`` reads x, but symtable records only the binding.
    read |= _augmented_names(tree) & top_level
    read |= _globals_read(_nested_scopes(table))
    return frozenset(read & _read_before_bound(tree.body))


def definitions_read(source: str) -> frozenset[str]:
    """The global names read by the functions, classes and lambdas ``source`` defines
    (a session sends them with every later cell)."""
    table = symtable.symtable(source, "<ddp cell>", "exec")
    return frozenset(_globals_read(_definitions(table)))


def _globals_read(scopes: Iterable[symtable.SymbolTable]) -> set[str]:
    """The global names ``scopes`` read (or declare ``global``)."""
    return {
        sym.get_name()
        for scope in scopes
        for sym in scope.get_symbols()
        if sym.is_global() and (sym.is_referenced() or sym.is_declared_global())
    }


_COMPREHENSIONS = frozenset({"listcomp", "setcomp", "dictcomp", "genexpr"})


def _definitions(table: symtable.SymbolTable) -> Iterator[symtable.SymbolTable]:
    """The scopes of every definition in ``table`` (comprehensions run at once: not theirs)."""
    for child in table.get_children():
        if child.get_name() in _COMPREHENSIONS:
            yield from _definitions(child)
        else:
            yield child
            yield from _nested_scopes(child)


def _nested_scopes(table: symtable.SymbolTable) -> Iterator[symtable.SymbolTable]:
    for child in table.get_children():
        yield child
        yield from _nested_scopes(child)


def _augmented_names(tree: ast.AST) -> set[str]:
    return {
        node.target.id
        for node in ast.walk(tree)
        if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name)
    }


def _read_before_bound(body: list[ast.stmt]) -> set[str]:
    """Names read by a top-level statement before one unconditionally bound them."""
    bound: set[str] = set()
    read: set[str] = set()
    for stmt in body:
        # A statement's reads happen before its binding (``x = x + 1``), and
        # a read anywhere, even inside a function body, counts.
        read |= _reads(stmt) - bound
        bound |= _bindings(stmt)
    return read


def _reads(node: ast.AST) -> set[str]:
    """Names ``node`` reads; a ``for``/``with`` body's reads of its own targets are not."""
    if isinstance(node, ast.For | ast.AsyncFor):
        inner = set().union(*(_reads(n) for n in [*node.body, *node.orelse]))
        return _reads(node.iter) | (inner - _stored(node.target))
    if isinstance(node, ast.With | ast.AsyncWith):
        heads = [item.context_expr for item in node.items]
        targets = set().union(*(_stored(i.optional_vars) for i in node.items if i.optional_vars))
        inner = set().union(*(_reads(n) for n in node.body))
        return set().union(*(_reads(h) for h in heads)) | (inner - targets)
    found = {
        n.id for n in ast.walk(node) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Store)
    }
    return found | _augmented_names(node)


def _stored(target: ast.AST) -> set[str]:
    return {
        n.id for n in ast.walk(target) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
    }


def _bindings(stmt: ast.stmt) -> set[str]:
    """The names ``stmt`` binds whenever it runs (none for ``if``, ``for``, ``try``...)."""
    if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {stmt.name}
    if isinstance(stmt, ast.Import | ast.ImportFrom):
        return {
            (alias.asname or alias.name).split(".")[0] for alias in stmt.names if alias.name != "*"
        }
    if isinstance(stmt, ast.Assign):
        return set().union(*(_stored(target) for target in stmt.targets))
    if isinstance(stmt, ast.AnnAssign) and stmt.value is not None:  # ``x: int`` binds nothing
        return _stored(stmt.target)
    return set()


def select_names(
    user_ns: Mapping[str, object], names: Iterable[str], hidden: Iterable[str] = ()
) -> dict[str, object]:
    """The ``names`` that ``user_ns`` holds, minus IPython's own (``hidden`` and history)."""
    skip = set(hidden)
    return {
        name: user_ns[name]
        for name in sorted(names)
        if name in user_ns and name not in skip and not _INTERNAL.fullmatch(name)
    }


# Tokens that only lay code out: a cell's last token that is not one of them ends it.
_LAYOUT = (tokenize.NEWLINE, tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT)


def is_quiet(source: str) -> bool:
    """True if the cell ends with ``;``: as in IPython, its value is not displayed."""
    last = None
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type not in _LAYOUT and tok.type != tokenize.ENDMARKER:
                last = tok
    except (tokenize.TokenError, SyntaxError):
        return False
    return last is not None and last.type == tokenize.OP and last.string == ";"
