"""The user-facing launch options, defined once.

``LaunchOptions`` defines every option: its type, and in its ``Opt`` metadata its default, help and
magic spelling (``Magic``). ``OPTIONS`` reads it back as ``Option`` records; ``LaunchConfig.build``,
``Launcher``, the magics' flags and help, ``merge_options``/``format_options`` and the panel all
derive from it (``tests/unit/test_options.py`` holds ``launch()``'s parameters to it). Validation is
``LaunchConfig.build``'s; nothing here imports IPython, torch or ray.
"""

import argparse
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import NoneType, UnionType
from typing import Annotated, Literal, TypedDict, Union, cast, get_args, get_origin, get_type_hints

from nbddp.launcher.clusters import Cluster
from nbddp.wire.protocol import Backend as Backend

StartMethod = Literal["forkserver", "spawn", "fork"]
MixedPrecision = Literal["no", "fp16", "bf16", "fp8"]
Output = Literal["all", "rank0", "none"]

DEFAULT_TAIL = 40


# -- how the magics spell values ------------------------------------------------


def parse_gpus(text: str) -> int | list[int]:
    """``--gpus``: ``2`` (a count) or ``0,1`` (GPU ids; one id as ``3,``)."""
    parts = [p.strip() for p in text.strip().strip("[]").split(",")]
    try:
        if "," not in text:
            return int(text)
        return [int(p) for p in parts if p]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--gpus takes a count (2) or GPU ids (0,1; a single id as 3,), got {text!r}"
        ) from None


def show_gpus(value: object) -> list[str]:
    """``--gpus`` as typed: a count as itself, ids as ``0,1,`` (so one id stays a list)."""
    if isinstance(value, int):
        return [str(value)]
    return [",".join(map(str, cast(Sequence[int], value))) + ","]


def parse_env_pair(text: str) -> tuple[str, str]:
    """``--env NAME=VALUE`` (the value may contain ``=``)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--env takes NAME=VALUE, got {text!r}")
    return key, value


def show_env(value: object) -> list[str]:
    """One ``NAME=VALUE`` per variable."""
    return [f"{key}={val}" for key, val in cast(Mapping[str, str], value).items()]


def show_value(value: object) -> list[str]:
    """A number or a word as typed on a magic line (``600`` for ``600.0``)."""
    return [f"{value:g}" if isinstance(value, float) else str(value)]


@dataclass(frozen=True)
class Magic:
    """How the magics spell an option: ``--`` and its name with dashes, then one value."""

    metavar: str | None = None
    parse: Callable[[str], object] | None = None
    """Text to value (argparse's ``type``); None: the text itself (or one of the choices)."""
    show: Callable[[object], list[str]] = show_value
    """Value to the text after the flag, once per occurrence (``format_options``)."""
    repeat: bool = False
    """Given once per item (``--env A=1 --env B=2``); the items make a dict."""
    switch: bool = False
    """A flag without a value (``--debug``): given, it is True."""


@dataclass(frozen=True)
class Opt:
    """What a ``LaunchOptions`` key says about itself besides its type."""

    default: object
    help: str
    magic: Magic | None = None
    """None: the magics have no flag for it."""
    group: str | None = None
    """Options of one group replace each other when merged (``--procs``, ``--gpus``)."""
    merges: bool = False
    """Merged key by key instead of replaced (``env``)."""


class LaunchOptions(TypedDict, total=False):
    """Every user-facing launch option; all optional."""

    gpus: Annotated[
        int | Sequence[int] | None,
        Opt(
            None,
            "one process per GPU: a count (2) or GPU ids (0,1; one id as 3,); nccl",
            Magic("N|IDS", parse_gpus, show_gpus),
            group="devices",
        ),
    ]
    procs: Annotated[
        int | None,
        Opt(
            None,
            "N CPU processes (gloo), GPUs hidden",
            Magic("N", int),
            group="devices",
        ),
    ]
    nodes: Annotated[
        int,
        Opt(
            1,
            "machines to run on, gpus/procs ranks on each (more than 1 needs --cluster)",
            Magic("N", int),
        ),
    ]
    cluster: Annotated[
        str | Cluster | None,
        Opt(
            None,
            "the cluster to run on: slurm (the allocation this runs in), ray://head:10001, "
            "ray (the Ray cluster this runs in), host:port",
            Magic("ADDRESS"),
        ),
    ]
    start_method: Annotated[
        StartMethod,
        Opt(
            "forkserver",
            "how ranks start (default forkserver: torch preloaded, CUDA untouched)",
            Magic(),
        ),
    ]
    port: Annotated[
        int | str | None,
        Opt(None, "rendezvous port (default: a free one per run)", Magic(None, int)),
    ]
    master_addr: Annotated[
        str, Opt("127.0.0.1", "rendezvous address (default 127.0.0.1)", Magic("ADDR"))
    ]
    timeout: Annotated[
        float | None,
        Opt(None, "stop the run after this long", Magic("SECONDS", float)),
    ]
    env: Annotated[
        Mapping[str, str] | None,
        Opt(
            None,
            "an environment variable for every rank (repeatable)",
            Magic("NAME=VALUE", parse_env_pair, show_env, repeat=True),
            merges=True,
        ),
    ]
    mixed_precision: Annotated[
        MixedPrecision,
        Opt("no", "exported as ACCELERATE_MIXED_PRECISION for Accelerator()", Magic()),
    ]
    backend: Annotated[
        Backend | None,
        Opt(None, "the process-group backend (default nccl on GPUs, gloo on CPU)"),
    ]
    init_process_group: Annotated[
        bool, Opt(False, "initialise the default process group before calling the function")
    ]
    max_restarts: Annotated[
        int,
        Opt(
            0,
            "after a failure, stop every rank and restart them all, up to N times",
            Magic("N", int),
        ),
    ]
    output: Annotated[
        Output,
        Opt("all", "whose output the cell shows (default all)", Magic()),
    ]
    tail: Annotated[
        int,
        Opt(
            DEFAULT_TAIL,
            "in a notebook, how many recent lines each rank's block shows",
            Magic("N", int),
        ),
    ]
    debug: Annotated[
        bool,
        Opt(
            False,
            "when a rank raises, open a debugger (pdb) on the frame that raised, in the cell",
            Magic(switch=True, show=lambda value: []),
        ),
    ]


@dataclass(frozen=True)
class Option(Opt):
    """One launch option, as ``LaunchOptions`` defines it: its ``Opt``, named and typed."""

    name: str = ""
    type: object = None
    """The value's type (without the ``Annotated`` metadata)."""
    choices: tuple[str, ...] = ()
    """The allowed values when the type is a ``Literal`` (or one or None)."""

    @property
    def flag(self) -> str:
        """The magics' spelling: ``--start-method``."""
        return "--" + self.name.replace("_", "-")


def literal_choices(tp: object) -> tuple[str, ...]:
    """The strings of a ``Literal`` type, also inside ``X | None``; () for other types."""
    if get_origin(tp) is Literal:
        return tuple(str(arg) for arg in get_args(tp))
    if get_origin(tp) in (Union, UnionType):
        for arg in get_args(tp):
            if arg is not NoneType and literal_choices(arg):
                return literal_choices(arg)
    return ()


def _read(definition: type) -> dict[str, Option]:
    options: dict[str, Option] = {}
    for name, hint in get_type_hints(definition, include_extras=True).items():
        tp, opt = get_args(hint)
        options[name] = Option(**vars(opt), name=name, type=tp, choices=literal_choices(tp))
    return options


OPTIONS: Mapping[str, Option] = _read(LaunchOptions)
"""Every launch option by name, in definition order (the order ``%%ddp?`` lists them)."""

DEFAULTS = cast(LaunchOptions, {name: option.default for name, option in OPTIONS.items()})


def magic_options() -> list[Option]:
    """The options the magics take, in the order ``%%ddp?`` lists them."""
    return [option for option in OPTIONS.values() if option.magic is not None]


def merge_options(defaults: LaunchOptions, given: LaunchOptions) -> LaunchOptions:
    """``given`` over ``defaults``: a group is replaced whole, a merging option merges."""
    groups = {OPTIONS[key].group for key in given} - {None}
    merged = {key: value for key, value in defaults.items() if OPTIONS[key].group not in groups}
    for key, value in given.items():
        if OPTIONS[key].merges and isinstance(value, Mapping):
            base = merged.get(key)
            merged[key] = {**(base if isinstance(base, Mapping) else {}), **value}
        else:
            merged[key] = value
    return cast(LaunchOptions, merged)


def format_options(options: LaunchOptions) -> str:
    """``options`` as the magic line that gives them (each must have a flag)."""
    parts: list[str] = []
    for key, value in options.items():
        option = OPTIONS[key]
        if option.magic is None:
            raise ValueError(f"the magics have no flag for {key}")
        if option.magic.switch:
            parts += [option.flag] if value else []
        else:
            # A value with spaces (a Slurm cluster's flags) is one quoted word.
            words = [shlex.quote(t) if t.split() != [t] else t for t in option.magic.show(value)]
            parts += [f"{option.flag} {text}" for text in words]
    return " ".join(parts)
