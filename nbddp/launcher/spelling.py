"""How each entry point spells the launch options, so its messages use its own words.

Contract: a ``Spelling`` turns a launch option (a name of ``options.OPTIONS``)
into the words of one entry point: ``launch()`` says ``procs=4``, ``%%ddp``
says ``--procs 4``, ``notebook_launcher`` says ``num_processes=4``,
``spawn`` says ``nprocs=4`` and the panel names its field (``Processes``).
``LaunchConfig.build`` takes one and writes every message with it, and the
config keeps it for the checks made after ``build`` (the call's signature).
``KEYWORDS`` (``launch``, ``Launcher``) is the default; each entry point
that spells options differently passes its own.

``close_options`` finds the launch options a mistyped or foreign name most
likely meant (``nprocs``, ``gpu``, torchrun's ``nproc_per_node``,
accelerate's ``num_processes``); ``launch()`` and the magics suggest them.
Nothing here validates a value.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

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
        """How to leave the option at its default of None: ``use None``, ``leave out
        --port``, ``leave Master port empty``."""
        if self.style == "flag":
            return f"leave out {self.name(option)}"
        if self.style == "field":
            return f"leave {self.name(option)} empty"
        return "use None"

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
