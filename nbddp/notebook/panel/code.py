"""The panel's "Same run as code": source that makes the panel's call when pasted.

``call_source(fn, args, kwargs, namespace)`` writes each part of ``fn(*args, **kwargs)`` for the
notebook's ``namespace``: a short literal that reads back as itself, else the notebook name bound
to that very object, else a longer literal; ``fn`` by name, module attribute or import. Anything
else becomes a placeholder name with a comment saying to define it, so pasted code never runs with
a wrong value. ``run_code`` adds the form's non-default settings as a ``%%ddp`` cell and a
``nbddp.launch(...)`` call.
"""

from __future__ import annotations

import ast
import inspect
import keyword
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType

from nbddp.launcher.options import OPTIONS, format_options
from nbddp.notebook.panel.settings import PanelSettings

SHORT_LITERAL = 60  # characters: a literal up to this long beats a notebook name
LONG_LITERAL = 1000  # characters: a longer literal is written only if no name holds it
# launch() reads these keywords itself: the function gets them through a partial.
_LAUNCH_KEYWORDS = frozenset({*OPTIONS, "block"})


@dataclass(frozen=True)
class CallSource:
    """``fn(*args, **kwargs)`` as source."""

    fn: str
    """The function: ``train``, ``mylib.train``."""
    args: tuple[str, ...]
    kwargs: tuple[tuple[str, str], ...]
    """(keyword, source of its value), in the call's order."""
    setup: tuple[str, ...] = ()
    """Lines the call needs first: imports, and a comment per placeholder."""
    placeholders: int = 0
    """How many names stand for objects the code could not write."""

    @property
    def complete(self) -> bool:
        """True when the code runs as pasted (no placeholder to define first)."""
        return self.placeholders == 0

    def call(self) -> str:
        """``train(3, data, lr=0.1)``."""
        return f"{self.fn}({_joined(self.args, self.kwargs)})"


def run_code(source: CallSource, settings: PanelSettings) -> tuple[str, str]:
    """The ``%%ddp`` cell and the ``nbddp.launch(...)`` call that make ``source``'s call
    with valid ``settings`` (the options that differ from the defaults)."""
    options = settings.options()
    setup = list(source.setup)
    # --no-init: like launch(), the cell leaves the process group to the function. Both forms
    # bind the value to a name, not the cell's result (a state_dict would print in full).
    head = " ".join(filter(None, ["%%ddp --no-init", format_options(options), "--out result"]))
    magic = "\n".join([head, *setup, f"result = {source.call()}"])
    # A keyword launch() would take as its own option reaches fn through a partial.
    bound = tuple((k, v) for k, v in source.kwargs if k in _LAUNCH_KEYWORDS)
    passed = tuple((k, v) for k, v in source.kwargs if k not in _LAUNCH_KEYWORDS)
    fn = source.fn
    if bound:
        setup.insert(0, "import functools")
        fn = f"functools.partial({fn}, {_joined((), bound)})"
    given = tuple((k, repr(v)) for k, v in options.items())
    launch = f"result = nbddp.launch({_joined((fn, *source.args), (*passed, *given))})"
    return magic, "\n".join([*setup, launch])


def call_source(
    fn: Callable[..., object],
    args: tuple[object, ...],
    kwargs: Mapping[str, object],
    namespace: Mapping[str, object],
) -> CallSource:
    """``fn(*args, **kwargs)`` as source for the notebook ``namespace``."""
    writer = _Writer(namespace)
    fn_text = writer.function(fn)
    params = _parameter_names(fn, len(args))
    arg_texts = tuple(writer.value(value, params[i]) for i, value in enumerate(args))
    kw_texts = tuple((key, writer.value(value, key)) for key, value in kwargs.items())
    return CallSource(fn_text, arg_texts, kw_texts, tuple(writer.setup), writer.placeholders)


def literal_source(value: object, limit: int = LONG_LITERAL) -> str | None:
    """``repr(value)`` if it is at most ``limit`` characters and reads back as ``value``
    (``ast.literal_eval``, the same types all the way down), else None."""
    # Why measure first: the form is re-checked on every keystroke, and the repr
    # of a million-element list costs more than a keystroke may.
    if not _fits(value, limit):
        return None
    try:  # a repr may raise anything, and literal_eval says what it cannot read as several
        text = repr(value)
        return text if len(text) <= limit and _same(ast.literal_eval(text), value) else None
    except Exception:
        return None


def _fits(value: object, budget: int) -> bool:
    """False when ``value``'s repr is sure to exceed ``budget`` characters: its strings,
    or its built-in containers' items, are too many (each item takes a character)."""
    stack, left = [value], budget
    while stack:
        item = stack.pop()
        if isinstance(item, str | bytes):
            left -= len(item)
        elif isinstance(item, list | tuple | set | frozenset):
            left -= len(item)
            if left >= 0:
                stack.extend(item)
        elif isinstance(item, dict):
            left -= 2 * len(item)
            if left >= 0:
                stack.extend(item.keys())
                stack.extend(item.values())
        if left < 0:
            return False
    return True


def _same(back: object, value: object) -> bool:
    """``back`` equals ``value`` with the same types (an int subclass is no int)."""
    if type(back) is not type(value):
        return False
    if isinstance(back, list | tuple) and isinstance(value, list | tuple):
        return len(back) == len(value) and all(map(_same, back, value))
    if isinstance(back, dict) and isinstance(value, dict):
        return len(back) == len(value) and all(
            _same(bk, vk) and _same(bv, vv)
            for (bk, bv), (vk, vv) in zip(back.items(), value.items(), strict=True)
        )
    try:
        return bool(back == value)
    except Exception:
        return False


class _Writer:
    """Writes values for one call, collecting the lines they need first."""

    def __init__(self, namespace: Mapping[str, object]) -> None:
        self.namespace = namespace
        self.setup: list[str] = []
        self.placeholders = 0
        self._taken: set[str] = set()  # placeholder names used in this call

    def value(self, value: object, param: str) -> str:
        noun = type(value).__name__
        return (
            literal_source(value, SHORT_LITERAL)
            or bound_name(self.namespace, value)
            or literal_source(value)
            or self._placeholder(param, f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}")
        )

    def function(self, fn: Callable[..., object]) -> str:
        own = getattr(fn, "__name__", None)
        own = own if isinstance(own, str) and _is_name(own) else None
        mine = own is not None and self.namespace.get(own) is fn
        name = own if mine else bound_name(self.namespace, fn)
        if name is not None:
            return name
        if own is not None:
            for module_name, module in self.namespace.items():
                held = isinstance(module, ModuleType) and getattr(module, own, None) is fn
                if held and _is_name(module_name):
                    return f"{module_name}.{own}"
            path = getattr(fn, "__module__", None)
            module = sys.modules.get(path) if isinstance(path, str) else None
            if path != "__main__" and getattr(module, own, None) is fn:
                self.setup.append(f"from {path} import {own}")
                return own
        shown = f"a function ({own or getattr(fn, '__name__', type(fn).__name__)})"
        return self._placeholder(own or "fn", shown)

    def _placeholder(self, wanted: str, what: str) -> str:
        """A name no notebook variable and no other placeholder uses, and its comment."""
        name, n = wanted, 0
        while name in self.namespace or name in self._taken:
            n += 1
            name = f"{wanted}_{n}"
        self._taken.add(name)
        self.placeholders += 1
        self.setup.append(
            f"# define {name} first: nbddp.panel was given {what} that no notebook name holds"
        )
        return name


def bound_name(namespace: Mapping[str, object], value: object) -> str | None:
    """The notebook's public name for ``value`` itself, if one holds it."""
    for name, bound in list(namespace.items()):  # a copy: the notebook may be changing it
        if bound is value and _is_name(name) and not name.startswith("_"):
            return name
    return None


def _parameter_names(fn: Callable[..., object], count: int) -> list[str]:
    """A name for each of ``count`` positional arguments: its parameter's, else ``argN``."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        params = []
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    names: list[str] = []
    for param in params:
        if param.kind in positional:
            names.append(param.name)
        elif param.kind is inspect.Parameter.VAR_POSITIONAL:
            names += [f"{param.name}_{j}" for j in range(count - len(names))]
    return names[:count] + [f"arg{i}" for i in range(len(names), count)]


def _is_name(text: str) -> bool:
    return text.isidentifier() and not keyword.iskeyword(text)


def _joined(args: tuple[str, ...], kwargs: tuple[tuple[str, str], ...]) -> str:
    return ", ".join([*args, *(f"{key}={text}" for key, text in kwargs)])
