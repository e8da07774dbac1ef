"""How each entry point spells the launch options, so its messages use its own words.

Contract: a ``Spelling`` turns a launch option (a name of ``options.OPTIONS``)
into the words of one entry point: ``launch()`` says ``procs=4``, ``%%ddp``
says ``--procs 4``, ``notebook_launcher`` says ``num_processes=4``,
``spawn`` says ``nprocs=4`` and the panel names its field (``Processes``).

The checks of the options raise ``OptionError``: the option, its value, and
the message as a function of a spelling, shown in ``KEYWORDS`` (``launch``'s)
until an entry point words it in its own, at one place: ``with
spelling.speaking():`` around what it does, which rewords every
``OptionError`` raised inside, whichever check raised it.

``close_options`` finds the launch options a mistyped or foreign name most
likely meant (``nprocs``, ``gpu``, torchrun's ``nproc_per_node``,
accelerate's ``num_processes``); ``launch()`` and the magics suggest them.
Nothing here validates a value.
"""

from __future__ import annotations

import contextlib
import contextvars
import difflib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Literal

from nbddp.errors import ConfigError, NbddpError, PayloadError
from nbddp.launcher.options import OPTIONS

ALIASES: Mapping[str, tuple[str, ...]] = {
    # torch.multiprocessing.spawn, torchrun, accelerate and common habits.
    "nprocs": ("procs",),
    "nproc": ("procs",),
    "num_procs": ("procs",),
    "processes": ("procs",),
    "num_workers": ("procs",),
    "nproc_per_node": ("gpus", "procs"),
    "num_processes": ("gpus", "procs"),
    "world_size": ("gpus", "procs"),
    "ngpus": ("gpus",),
    "num_gpus": ("gpus",),
    "gpu_ids": ("gpus",),
    "device_ids": ("gpus",),
    "devices": ("gpus",),
    "master_port": ("port",),
    "main_process_port": ("port",),
    "use_port": ("port",),
    "master_address": ("master_addr",),
    "main_process_ip": ("master_addr",),
    "environment": ("env",),
    "env_vars": ("env",),
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
    """How one entry point spells the launch options (see module contract)."""

    style: Style = "keyword"
    """``keyword``: ``procs=4``; ``flag``: ``--procs 4`` (the magics); ``field``: the panel's
    form, by the field's label."""
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
        """How to leave the option at its default of None: ``use port=None``, ``leave out
        --port``, ``leave Master port empty``."""
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
        """Launch options offered instead of a mistaken keyword given ``value``: ``the
        launch option procs=2``, ``the launch option gpus=2 or procs=2``, ``the panel's
        Processes field``."""
        if self.style == "field":
            return " or ".join(f"the panel's {self.name(option)} field" for option in options)
        return "the launch option " + " or ".join(self.given(o, value) for o in options)

    @property
    def cpu_over_gpus(self) -> bool:
        """Whether the caller can ask for CPU ranks while GPUs are visible: not where one
        parameter stands for both (``notebook_launcher``'s ``num_processes`` takes GPUs
        whenever any is visible), so messages offer that alternative only here."""
        return self.name("procs") != self.name("gpus")

    @contextlib.contextmanager
    def speaking(self) -> Iterator[None]:
        """Inside the block, ``spoken`` says things in this spelling, and every
        ``OptionError`` (any ``Worded``) raised is reworded in it, unless a block
        inside it (another entry point's) already has."""
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
    """An error whose message names launch options: worded in ``KEYWORDS`` until an
    entry point rewords it (``Spelling.speaking``)."""

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
    """A launch option that is wrong: which (``option``), its ``value``, and a message
    that says what is wrong and what to do."""

    plain = ConfigError

    def __init__(self, option: str, value: object, say: Say) -> None:
        super().__init__(say)
        self.option = option
        self.value = value


class CallError(Worded, PayloadError):
    """A call that cannot bind to the launched function's signature, with a launch
    option it probably meant."""

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
        "cluster": "Ray cluster",
        "start_method": "Start method",
        "port": "Master port",
        "mixed_precision": "Mixed precision",
        "timeout": "Timeout (s)",
        "max_restarts": "Max restarts",
        "env": "Environment",
    },
)
"""The panel's form: its fields' labels (a unit test holds them to the view's)."""
