"""How each entry point spells the launch options, so its messages use its own words.

A ``Spelling`` turns an option name into one entry point's words (``procs=4``, ``--procs 4``,
``num_processes=4``, the panel's ``Processes``). Option checks raise ``OptionError`` worded in
``KEYWORDS``; an entry point's ``with spelling.speaking():`` rewords every one raised inside.
``close_options`` finds the options a mistyped or foreign name likely meant.

``check_call(fn, args, kwargs)``, before anything starts, raises a one-line ``CallError`` (a
``TypeError``) when the call cannot bind, offering a launch option a keyword was likely meant for.
``WithRank`` is checked as ``fn(rank, *args)``; where no signature can be read, nothing is.
"""

from __future__ import annotations

import contextlib
import contextvars
import difflib
import functools
import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from nbddp.errors import ConfigError, NbddpError, PayloadError
from nbddp.launcher.options import OPTIONS
from nbddp.rank.context import WithRank

if TYPE_CHECKING:
    from nbddp.wire.payload import Args, Fn

ALIASES: Mapping[str, tuple[str, ...]] = {
    # torch.multiprocessing.spawn, torchrun, accelerate and common habits.
    **dict.fromkeys(("nprocs", "nproc", "num_procs", "processes", "num_workers"), ("procs",)),
    **dict.fromkeys(("nproc_per_node", "num_processes", "world_size"), ("gpus", "procs")),
    **dict.fromkeys(("ngpus", "num_gpus", "gpu_ids", "device_ids", "devices"), ("gpus",)),
    **dict.fromkeys(("master_port", "main_process_port", "use_port"), ("port",)),
    **dict.fromkeys(("master_address", "main_process_ip"), ("master_addr",)),
    **dict.fromkeys(("environment", "env_vars"), ("env",)),
    "dist_backend": ("backend",),
    "precision": ("mixed_precision",),
}
"""Names other launchers use for a launch option (normalised: lower case, ``_``)."""

CLOSE = 0.8  # difflib ratio: "gpu" ~ "gpus" (0.86), "nprocs" ~ "procs" (0.91), not "out" ~ "output"


def close_options(word: str) -> tuple[str, ...]:
    """The launch options ``word`` most likely meant (a known alias, else the nearest
    name), or () when none is close; ``--nproc-per-node`` counts as ``nproc_per_node``."""
    name = word.lstrip("-").replace("-", "_").lower()
    if name in ALIASES:
        return ALIASES[name]
    return tuple(difflib.get_close_matches(name, list(OPTIONS), n=1, cutoff=CLOSE))


Style = Literal["keyword", "flag", "field"]


@dataclass(frozen=True)
class Spelling:
    """How one entry point spells the launch options."""

    style: Style = "keyword"
    """``keyword``: ``procs=4``; ``flag``: ``--procs 4``; ``field``: the panel's label."""
    names: Mapping[str, str] = field(default_factory=dict)
    """An option's name at this entry point where it differs (``procs``: ``nprocs``)."""

    def name(self, option: str) -> str:
        """The option as this entry point names it: ``procs``, ``--procs``, ``Processes``."""
        if option in self.names:
            return self.names[option]
        if self.style == "flag" and OPTIONS[option].magic is not None:
            return OPTIONS[option].flag
        return option

    def hole(self, option: str, text: str) -> str:
        """The option given ``text`` as typed: ``procs=N``, ``--procs N``."""
        if self.style == "keyword" or self.name(option) == option:
            return f"{self.name(option)}={text}"
        return f"{self.name(option)} {text}"

    def given(self, option: str, value: object) -> str:
        """The option given ``value``: ``gpus=[0, 1]``, ``--gpus 0,1,``, ``GPUs [0, 1]``."""
        magic = OPTIONS[option].magic
        if self.style == "flag" and magic is not None and option not in self.names:
            return self.hole(option, magic.show(value)[0])
        if self.style == "keyword" or self.name(option) == option:
            return self.hole(option, repr(value))
        return self.hole(option, str(value))

    def unset(self, option: str) -> str:
        """How to leave the option at None: ``use port=None``, ``leave out --port``."""
        if self.style == "flag":
            return f"leave out {self.name(option)}"
        if self.style == "field":
            return f"leave {self.name(option)} empty"
        return f"use {self.name(option)}=None"

    def env_entry(self, key: str, value: str) -> str:
        """One variable of the ``env`` option: ``env['A']``, ``--env A=1``."""
        if self.style == "keyword":
            return f"{self.name('env')}[{key!r}]"
        return f"{self.name('env')} {key}={value}"

    def suggest(self, options: tuple[str, ...], value: object) -> str:
        """Options offered instead of a mistaken keyword: ``the launch option procs=2``."""
        if self.style == "field":
            return " or ".join(f"the panel's {self.name(option)} field" for option in options)
        return "the launch option " + " or ".join(self.given(o, value) for o in options)

    @property
    def cpu_over_gpus(self) -> bool:
        """Whether CPU ranks can be asked for while GPUs are visible (not one name for both)."""
        return self.name("procs") != self.name("gpus")

    @contextlib.contextmanager
    def speaking(self) -> Iterator[None]:
        """Inside the block ``spoken`` uses this spelling, and a ``Worded`` raised not yet
        reworded by an inner block is reworded in it."""
        token = _SPEAKING.set(self)
        try:
            yield
        except Worded as exc:
            if exc.spelling is None:
                exc.args, exc.spelling = (exc.say(self),), self
            raise
        finally:
            _SPEAKING.reset(token)


Say = Callable[[Spelling], str]
"""A message about launch options, in the words of the spelling it is given."""

_SPEAKING: contextvars.ContextVar[Spelling] = contextvars.ContextVar("nbddp_spelling")


def spoken(say: Say) -> str:
    """``say`` in the words of the entry point speaking now (``KEYWORDS`` by default)."""
    return say(_SPEAKING.get(KEYWORDS))


class Worded(NbddpError):
    """An error naming launch options: in ``KEYWORDS`` until ``Spelling.speaking`` rewords it."""

    plain: type[NbddpError] = NbddpError
    """What it is once it leaves this process, as worded then (``say`` may not pickle)."""

    def __init__(self, say: Say) -> None:
        super().__init__(say(KEYWORDS))
        self.say = say
        self.spelling: Spelling | None = None
        """The entry point's spelling it was reworded in; None: ``KEYWORDS`` so far."""

    def __reduce__(self) -> tuple[object, ...]:
        return self.plain, (str(self),)


class OptionError(Worded, ConfigError):
    """A wrong launch ``option`` and ``value``; the message says what to do."""

    plain = ConfigError

    def __init__(self, option: str, value: object, say: Say) -> None:
        super().__init__(say)
        self.option = option
        self.value = value


class CallError(Worded, PayloadError):
    """A call that does not bind to the function's signature, with the option it likely meant."""

    plain = PayloadError


KEYWORDS = Spelling()
"""``launch``, ``Launcher``: the options' own names as keyword arguments."""

FLAGS = Spelling("flag")
"""``%%ddp``, ``%ddp_config``, ``%ddp_panel``: ``--procs 4``."""

PANEL = Spelling(
    "field",
    {
        "gpus": "GPUs",
        "procs": "Processes",
        "nodes": "Nodes",
        "cluster": "Cluster",
        "start_method": "Start method",
        "port": "Master port",
        "mixed_precision": "Mixed precision",
        "timeout": "Timeout (s)",
        "max_restarts": "Max restarts",
        "env": "Environment",
    },
)
"""The panel's form: its fields' labels (a unit test holds them to the view's)."""


_RANK = 0  # stands for the rank spawn() puts first; only its position matters


def check_call(fn: Fn, args: Args, kwargs: Mapping[str, object]) -> None:
    """Raise ``CallError`` if ``fn(*args, **kwargs)`` cannot bind to ``fn``'s signature."""
    target, how = fn, ""
    if isinstance(fn, WithRank):
        target, args, how = fn.fn, (_RANK, *args), " (spawn calls it as fn(rank, *args))"
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return  # no signature to read: the ranks will say
    try:
        signature.bind(*args, **kwargs)
    except TypeError as exc:
        reason = str(exc)
        if reason.startswith(("too many", "multiple values")):
            reason = f"got {reason}"  # as Python says it: "f() got multiple values for ..."
        message = f"{_name(target)}() {reason}{how}"
        hint = _hint(str(exc), kwargs, signature.parameters)
        raise CallError(lambda s: f"{message}; {hint(s)}" if hint else message) from None


def _name(fn: Fn) -> str:
    while isinstance(fn, functools.partial):
        fn = fn.func
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    return name if isinstance(name, str) else type(fn).__name__


def _hint(error: str, kwargs: Mapping[str, object], params: Iterable[str]) -> Say | None:
    """``did you mean the launch option procs=2?`` for an unexpected keyword near one,
    else ``did you mean epochs=3?`` for one near a parameter of the function."""
    if "unexpected keyword" not in error:
        return None
    for key, value in kwargs.items():
        if repr(key) not in error:
            continue
        if options := close_options(key):
            return lambda s: f"did you mean {s.suggest(options, value)}?"
        if near := difflib.get_close_matches(key, list(params), 1, CLOSE):
            return lambda s: f"did you mean {near[0]}={value!r}?"
    return None
