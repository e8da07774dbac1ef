"""The panel's "Same run as code": source that runs the panel's call as pasted.

Each generated ``nbddp.launch(...)`` call is executed in the namespace it was
written for, with a stand-in ``nbddp.launch`` that splits launch options from
the function's arguments as the real one does, and must make the same call:
the same function, the very objects given to the panel, equal literals, and
the form's launch options.
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from nbddp.launcher.options import OPTIONS
from nbddp.notebook.panel.code import call_source, literal_source, run_code
from nbddp.notebook.panel.settings import PanelSettings

CPU = PanelSettings.initial(0)


def train(steps: int, data: object = None, *, lr: float = 0.1, timeout: float = 0.0) -> None:
    """A function whose keyword ``timeout`` is also a launch option's name."""


@dataclass
class Call:
    fn: Callable[..., object]
    args: tuple[object, ...]
    kwargs: dict[str, object]
    options: dict[str, object]


def executed(code: str, namespace: Mapping[str, object]) -> Call:
    """Run ``code`` in ``namespace`` with a stand-in ``nbddp.launch``; the call it made."""
    calls: list[Call] = []

    def launch(fn: Callable[..., object], *args: object, **kwargs: object) -> None:
        options = {k: kwargs.pop(k) for k in list(kwargs) if k in OPTIONS}
        if isinstance(fn, functools.partial):  # how a keyword named like an option travels
            fn, args, kwargs = fn.func, (*fn.args, *args), {**fn.keywords, **kwargs}
        calls.append(Call(fn, args, kwargs, options))

    exec(code, {**namespace, "nbddp": SimpleNamespace(launch=launch)})
    assert len(calls) == 1, code
    return calls[0]


def same(a: object, b: object) -> bool:
    return a is b or (type(a) is type(b) and a == b)


def assert_same_call(
    call: Call, fn: object, args: tuple[object, ...], kwargs: dict[str, Any]
) -> None:
    assert call.fn is fn
    assert len(call.args) == len(args) and all(map(same, call.args, args)), call.args
    assert call.kwargs.keys() == kwargs.keys()
    assert all(same(call.kwargs[k], v) for k, v in kwargs.items()), call.kwargs


@pytest.mark.parametrize(
    "value",
    [
        3,
        -0.5,
        1e300,
        "a 'quoted' \"string\"",
        b"\x00bytes",
        None,
        True,
        [1, (2, 3)],
        {"k": [1.5]},
        {1, 2},
        2 + 3j,
    ],
)
def test_literals_are_written_as_themselves(value: object) -> None:
    text = literal_source(value)
    assert text is not None
    assert same(eval(text), value)  # the test's own check: the text reads back as the value


class IntLike(int):
    pass


@pytest.mark.parametrize(
    "value",
    [float("nan"), IntLike(3), [IntLike(3)], object(), threading.Lock(), range(3), "x" * 2000],
)
def test_what_does_not_read_back_as_itself_is_no_literal(value: object) -> None:
    assert literal_source(value) is None


class CountedRepr(list[int]):
    reprs = 0

    def __repr__(self) -> str:
        CountedRepr.reprs += 1
        return super().__repr__()


def test_a_container_too_big_to_show_is_not_even_written_out() -> None:
    # The form is checked on every keystroke: no repr of what cannot fit anyway.
    big = CountedRepr(range(1_000_000))
    assert literal_source(big) is None and literal_source((big,)) is None
    assert literal_source({"k": ["x" * 2000]}) is None
    assert CountedRepr.reprs == 0


def test_the_code_names_what_the_notebook_holds_and_runs_as_pasted() -> None:
    data = [object()]  # not a literal
    long = list(range(1000))  # a literal, but too long to show
    namespace: dict[str, object] = {"train": train, "data": data, "xs": long, "_": data}
    args = (3, data)
    kwargs: dict[str, object] = {"lr": 0.5}
    source = call_source(train, args, kwargs, namespace)
    assert source.complete
    settings = replace(CPU, procs="3", timeout="120")
    magic, launch = run_code(source, settings)
    assert launch == "result = nbddp.launch(train, 3, data, lr=0.5, procs=3, timeout=120)"
    # The value comes back by name: pasted, the cell shows no big value as its result.
    assert magic == (
        "%%ddp --no-init --procs 3 --timeout 120 --out result\nresult = train(3, data, lr=0.5)"
    )
    call = executed(launch, namespace)
    assert_same_call(call, train, args, kwargs)
    assert call.options == {"procs": 3, "timeout": 120}
    # A long literal the notebook holds is written by its name.
    source = call_source(train, (1,), {"lr": long}, namespace)
    assert source.call() == "train(1, lr=xs)"


def test_only_non_default_options_are_written() -> None:
    source = call_source(train, (1,), {}, {"train": train})
    assert run_code(source, CPU)[1] == "result = nbddp.launch(train, 1, procs=2)"


def test_a_keyword_named_like_a_launch_option_goes_through_a_partial() -> None:
    namespace = {"train": train}
    source = call_source(train, (1,), {"timeout": 5.0, "lr": 0.2}, namespace)
    _, launch = run_code(source, replace(CPU, timeout="60"))
    assert launch.splitlines() == [
        "import functools",
        "result = nbddp.launch(functools.partial(train, timeout=5.0), 1, lr=0.2, procs=2, "
        "timeout=60)",
    ]
    call = executed(launch, namespace)
    assert_same_call(call, train, (1,), {"timeout": 5.0, "lr": 0.2})
    assert call.options == {"procs": 2, "timeout": 60.0}


def test_what_cannot_be_written_is_said_in_a_comment_and_named_after_its_parameter() -> None:
    lock = threading.Lock()
    namespace: dict[str, object] = {"train": train, "data": "another object"}
    source = call_source(train, (1, lock), {"lr": object()}, namespace)
    assert not source.complete
    _, launch = run_code(source, CPU)
    lines = launch.splitlines()
    # ``data`` is taken by another object: the placeholder must not pick it up silently.
    assert lines[-1] == "result = nbddp.launch(train, 1, data_1, lr=lr, procs=2)"
    assert lines[0].startswith("# define data_1 first: nbddp.panel was given a lock")
    assert lines[1].startswith("# define lr first: nbddp.panel was given an object")
    with pytest.raises(NameError, match="data_1"):  # never runs with a wrong value
        executed(launch, namespace)
    # Once defined, the pasted code makes the panel's call.
    call = executed(launch, {**namespace, "data_1": lock, "lr": 0.5})
    assert_same_call(call, train, (1, lock), {"lr": 0.5})


def test_the_function_is_found_by_identity_through_a_module_or_imported() -> None:
    # Bound under another name in the notebook.
    assert call_source(train, (1,), {}, {"fit": train}).fn == "fit"
    # Reachable as an attribute of a module the notebook imported.
    module = ModuleType("mylib")
    module.train = train  # type: ignore[attr-defined]
    assert call_source(train, (1,), {}, {"mylib": module}).fn == "mylib.train"
    # Importable from its own module.
    source = call_source(json.dumps, (1,), {}, {})
    assert source.setup == ("from json import dumps",) and source.fn == "dumps"
    assert source.complete


def test_a_lambda_nothing_holds_is_said_in_a_comment() -> None:
    source = call_source(lambda: 1, (), {}, {})
    assert not source.complete
    _, launch = run_code(source, CPU)
    assert launch.splitlines() == [
        "# define fn first: nbddp.panel was given a function (<lambda>) that no notebook "
        "name holds",
        "result = nbddp.launch(fn, procs=2)",
    ]
    # A lambda the notebook holds is written by that name.
    f = lambda: 1  # noqa: E731
    assert call_source(f, (), {}, {"f": f}).fn == "f"
