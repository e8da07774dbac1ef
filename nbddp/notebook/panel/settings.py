"""The panel's settings form as plain data: validation and the equivalent code.

Contract: ``PanelSettings`` holds what the form's fields hold, as the user
typed it (text fields stay text). ``validate()`` checks the form once: it
parses the text fields (a port, seconds, ``NAME=VALUE`` lines), checks each
field's option with the config's own check (``checks.check_option``), then
builds the ``LaunchConfig``; a message maps to its field, or to ``launch``
when only the combination is wrong. Its errors are empty exactly when it
carries the config, which is the one the panel launches. The form's own
checks are only about its device widgets (a GPU chosen, a sane process
count). The code renderers turn valid settings into the ``%%ddp`` cell and
the ``launch(...)`` call that run the same thing, so a configuration found by
clicking becomes code. Nothing here imports ipywidgets, starts a process or
touches CUDA.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from nbddp.errors import ConfigError
from nbddp.launcher.checks import check_option
from nbddp.launcher.config import LaunchConfig
from nbddp.launcher.options import OPTIONS, LaunchOptions, format_options
from nbddp.launcher.spelling import PANEL

DeviceChoice = Literal["gpu", "cpu"]
MAX_PROCS = 256  # a typo guard: more CPU ranks than this is never what was meant
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_LITERAL_TYPES = (bool, int, float, str, bytes, type(None))
_MAX_ARG_REPR = 60

FIELDS = (
    "device",
    "gpus",
    "procs",
    "nodes",
    "cluster",
    "start_method",
    "port",
    "mixed_precision",
    "timeout",
    "max_restarts",
    "env",
)
"""The form's fields, in display order (``errors()`` keys are among these, or ``launch``).
``gpus``, ``procs`` and the fields after them are the launch options of their names."""


@dataclass(frozen=True)
class Validated:
    """The form checked once (see module contract)."""

    errors: dict[str, str]
    """Field (or ``launch``) -> what is wrong, in form order; empty when valid."""
    options: LaunchOptions
    """The fields that parsed, as launch options (only what differs from the defaults)."""
    config: LaunchConfig | None
    """The launch the form describes; None exactly when there are errors."""


@dataclass(frozen=True)
class PanelSettings:
    """What the panel's form holds (see module contract)."""

    device: DeviceChoice = "cpu"
    gpus: tuple[int, ...] = ()
    """Notebook GPU ordinals chosen (device ``gpu``)."""
    procs: int = 2
    """CPU processes (device ``cpu``)."""
    nodes: str = ""
    """Machines of the cluster, as typed; empty: this machine only."""
    cluster: str = ""
    """The Ray cluster's address, as typed; empty: none."""
    start_method: str = cast(str, OPTIONS["start_method"].default)
    port: str = ""
    """Rendezvous port as typed; empty: a free one per run."""
    mixed_precision: str = cast(str, OPTIONS["mixed_precision"].default)
    timeout: str = ""
    """Seconds as typed; empty: no timeout."""
    max_restarts: str = ""
    """Restarts after a failure, as typed; empty: none."""
    env: str = ""
    """Extra environment variables, one ``NAME=VALUE`` per line."""
    visible_gpus: int = field(default=0, compare=False)
    """How many GPUs the notebook sees (detected without initialising CUDA)."""

    @classmethod
    def initial(cls, visible_gpus: int, options: LaunchOptions | None = None) -> PanelSettings:
        """Defaults for a machine with ``visible_gpus`` GPUs, overlaid with ``options``
        (e.g. a ``%ddp_config`` session's defaults)."""
        options = options or {}
        device, gpus, procs = _initial_devices(visible_gpus, options)
        port, timeout, env = options.get("port"), options.get("timeout"), options.get("env")
        return cls(
            device=device,
            gpus=gpus,
            procs=procs,
            nodes=str(options.get("nodes") or ""),
            cluster=str(options.get("cluster") or ""),
            start_method=options.get("start_method", cls.start_method),
            port="" if port is None else str(port),
            mixed_precision=options.get("mixed_precision", cls.mixed_precision),
            timeout="" if timeout is None else f"{timeout:g}",
            max_restarts=str(options.get("max_restarts") or ""),
            env="\n".join(f"{k}={v}" for k, v in (env or {}).items()),
            visible_gpus=visible_gpus,
        )

    # -- validation -------------------------------------------------------

    def validate(self) -> Validated:
        """Check the form once (see module contract)."""
        options, errors = self._parse()
        for name, value in options.items():
            try:
                with PANEL.speaking():
                    check_option(name, value)
            except ConfigError as exc:
                errors[name] = str(exc)
        if errors:
            order = [*FIELDS, "launch"]
            return Validated(
                dict(sorted(errors.items(), key=lambda e: order.index(e[0]))), options, None
            )
        try:
            with PANEL.speaking():
                config = LaunchConfig.build(**options)
        except ConfigError as exc:
            return Validated({"launch": str(exc)}, options, None)
        return Validated({}, options, config)

    def errors(self) -> dict[str, str]:
        """Field -> what is wrong with it; empty when the form describes a valid launch."""
        return dict(self.validate().errors)

    def options(self) -> LaunchOptions:
        """The settings as launch options (only what differs from the defaults).
        Raises ``ValueError`` on a field the form cannot parse."""
        options, errors = self._parse()
        if errors:
            raise ValueError("; ".join(f"{name}: {text}" for name, text in errors.items()))
        return options

    def _parse(self) -> tuple[LaunchOptions, dict[str, str]]:
        """The fields as launch options, and the fields that are not even that."""
        parsed, errors = self._devices()
        for name, parse in _PARSERS.items():
            try:
                value = parse(getattr(self, name))
            except ValueError as exc:
                errors[name] = str(exc)
                continue
            if value != OPTIONS[name].default:
                parsed[name] = value
        # Each value has its option's type or is caught by check_option/build.
        return cast(LaunchOptions, parsed), errors

    def _devices(self) -> tuple[dict[str, object], dict[str, str]]:
        """``gpus`` or ``procs``, or what the device widgets lack."""
        if self.device == "gpu":
            if not self.visible_gpus:
                return {}, {"device": "no GPU is visible to this notebook; choose CPU"}
            if not self.gpus:
                return {}, {"gpus": "choose at least one GPU"}
            every = tuple(range(self.visible_gpus))
            return {"gpus": len(self.gpus) if self.gpus == every else list(self.gpus)}, {}
        if not 1 <= self.procs <= MAX_PROCS:
            return {}, {"procs": f"a number of processes from 1 to {MAX_PROCS}"}
        return {"procs": self.procs}, {}

    # -- the same run as code ---------------------------------------------

    def magic_cell(self, call: str) -> str:
        """The ``%%ddp`` cell that runs ``call`` (e.g. ``train(3)``) with these settings.

        With ``--no-init``: like ``launch``, it leaves the process group to the function.
        """
        return f"%%ddp --no-init {format_options(self.options())}\n{call}"

    def launch_call(self, fn_name: str, args_code: str) -> str:
        """``nbddp.launch(fn, args..., options...)`` with these settings."""
        parts = [fn_name, *([args_code] if args_code else [])]
        for key, value in self.options().items():
            parts.append(f"{key}={value!r}")
        return f"nbddp.launch({', '.join(parts)})"


def _initial_devices(
    visible_gpus: int, options: LaunchOptions
) -> tuple[DeviceChoice, tuple[int, ...], int]:
    """(device, GPUs chosen, process count) for ``options``, else the machine's default."""
    procs, gpus = options.get("procs"), options.get("gpus")
    if procs is not None:
        return "cpu", tuple(range(visible_gpus)), int(procs)
    if isinstance(gpus, int):
        return "gpu", tuple(range(gpus)), PanelSettings.procs
    if gpus is not None:
        return "gpu", tuple(int(g) for g in gpus), PanelSettings.procs
    return ("gpu" if visible_gpus else "cpu"), tuple(range(visible_gpus)), PanelSettings.procs


def call_code(args: Sequence[Any], kwargs: Mapping[str, object]) -> tuple[str, bool]:
    """The arguments of a call as source (``"3, lr=0.1"``), and whether it is exact.

    Literals (numbers, strings, None, and lists/tuples/dicts of them) are
    written as themselves; anything else by name (``args[1]``,
    ``kwargs['model']``), and then the code is not exact: the user must
    supply those objects.
    """
    exact = True
    parts: list[str] = []
    for i, value in enumerate(args):
        text = _literal(value)
        if text is None:
            exact = False
            text = f"args[{i}]"
        parts.append(text)
    for key, value in kwargs.items():
        text = _literal(value)
        if text is None:
            exact = False
            text = f"kwargs[{key!r}]"
        parts.append(f"{key}={text}")
    return ", ".join(parts), exact


def _literal(value: Any) -> str | None:
    """``repr(value)`` when it is a short literal that reads back as itself, else None."""
    if not _is_literal(value):
        return None
    text = repr(value)
    return text if len(text) <= _MAX_ARG_REPR else None


def _is_literal(value: Any) -> bool:
    if isinstance(value, float) and value != value:  # nan does not read back
        return False
    if type(value) in _LITERAL_TYPES:
        return True
    if type(value) in (list, tuple):
        return all(_is_literal(v) for v in value)
    if type(value) is dict:
        return all(_is_literal(k) and _is_literal(v) for k, v in value.items())
    return False


def _text(text: str) -> str:
    return text


def _port(text: str) -> int | None:
    text = text.strip()
    if not text or text.lower() == "auto":
        return None
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"a port number (1-65535), or empty for any; got {text!r}") from None


def _timeout(text: str) -> float | None:
    text = text.strip()
    if not text or text.lower() == "none":
        return None
    try:
        seconds = float(text)
    except ValueError:
        raise ValueError(f"seconds (e.g. 600), or empty for none; got {text!r}") from None
    if not math.isfinite(seconds):
        raise ValueError(f"a positive number of seconds, or empty for none; got {text!r}")
    return seconds


def _max_restarts(text: str) -> int:
    text = text.strip()
    if not text:
        return 0
    if not text.isdigit():
        raise ValueError(f"a whole number of restarts (0 or more), or empty for none; got {text!r}")
    return int(text)


def _env(text: str) -> dict[str, str] | None:
    env: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.partition("=")
        name = name.strip()
        if not sep or not _ENV_NAME.match(name):
            raise ValueError(f"line {number}: NAME=VALUE with a variable name, got {line!r}")
        env[name] = value
    return env or None


def _nodes(text: str) -> int:
    text = text.strip()
    if not text:
        return 1
    if not text.isdigit():
        raise ValueError(f"a number of machines (1 or more), or empty for this one; got {text!r}")
    return int(text)


def _cluster(text: str) -> str | None:
    return text.strip() or None


_PARSERS: dict[str, Callable[[str], object]] = {
    "nodes": _nodes,
    "cluster": _cluster,
    "start_method": _text,
    "port": _port,
    "timeout": _timeout,
    "max_restarts": _max_restarts,
    "env": _env,
    "mixed_precision": _text,
}
"""The form's text fields (in the order the code shows them): text to option value."""
