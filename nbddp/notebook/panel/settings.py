"""The panel's settings form as plain data: validation and the options it launches.

``PanelSettings`` holds the fields as typed (text stays text). ``validate()`` checks the whole
form once and reports every wrong field at once (by field name, or ``launch`` for a wrong
combination): it parses the text fields, checks each option (``checks.check_option``) and the
call, then builds the ``LaunchConfig``; errors are empty exactly when it carries the config the
panel launches. Nothing here imports ipywidgets, starts a process or touches CUDA.
"""

from __future__ import annotations

import ast
import keyword
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, cast

from nbddp.errors import ConfigError
from nbddp.launcher.checks import check_option
from nbddp.launcher.config import LaunchConfig
from nbddp.launcher.options import OPTIONS, LaunchOptions
from nbddp.launcher.spelling import PANEL, OptionError

DeviceChoice = Literal["gpu", "cpu"]
MAX_PROCS = 256  # a typo guard: more CPU ranks than this is never what was meant
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_WHOLE = re.compile(r"[0-9]+\Z")
# The launch's own check judges these fields' values alone (env: the variables
# nbddp sets, which depend on the launch): their errors go by their fields.
_JUDGED_BY_LAUNCH = frozenset({"env"})

FIELDS = ("device", *PANEL.names)
"""The form's launch fields, in display order: the device, then the launch options the
panel labels (``spelling.PANEL``)."""
FORM = ("kwargs", *FIELDS)
"""Every field, in display order: the function's keyword arguments, then the launch's
(``Validated.errors`` keys are among these, or ``launch``)."""


@dataclass(frozen=True)
class Validated:
    """The form checked once: every field's error, or the config to launch."""

    errors: dict[str, str]
    """Field (or ``launch``) -> what is wrong, in form order; empty when valid."""
    config: LaunchConfig | None
    """The launch the form describes; None exactly when there are errors."""
    kwargs: dict[str, object] = field(default_factory=dict)
    """The function's keyword arguments from the form (empty when that field is wrong)."""


@dataclass(frozen=True)
class PanelSettings:
    """What the panel's form holds, as typed."""

    device: DeviceChoice = "cpu"
    gpus: tuple[int, ...] = ()
    """Notebook GPU ordinals chosen (device ``gpu``)."""
    procs: str = "2"
    """CPU processes (device ``cpu``), as typed."""
    nodes: str = ""
    """Machines of the cluster, as typed; empty: this machine only."""
    cluster: str = ""
    """The cluster, as typed (slurm, or a Ray address); empty: none."""
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
    kwargs: str = ""
    """The function's keyword arguments, ``epochs=3, lr=0.1`` (``parse_kwargs``)."""
    visible_gpus: int = field(default=0, compare=False)
    """How many GPUs the notebook sees (detected without initialising CUDA)."""

    @classmethod
    def initial(
        cls, visible_gpus: int, options: LaunchOptions | None = None, kwargs: str = ""
    ) -> PanelSettings:
        """Defaults for a machine with ``visible_gpus`` GPUs, overlaid with ``options``
        (e.g. a ``%ddp_config`` session's defaults), with ``kwargs`` as typed."""
        options = options or {}
        device, gpus, procs = _initial_devices(visible_gpus, options)
        port, timeout, env = options.get("port"), options.get("timeout"), options.get("env")
        return cls(
            device=device,
            gpus=gpus,
            procs=str(procs),
            nodes=str(options.get("nodes") or ""),
            cluster=str(options.get("cluster") or ""),
            start_method=options.get("start_method", cls.start_method),
            port="" if port is None else str(port),
            mixed_precision=options.get("mixed_precision", cls.mixed_precision),
            timeout="" if timeout is None else f"{timeout:g}",
            max_restarts=str(options.get("max_restarts") or ""),
            env="\n".join(f"{k}={v}" for k, v in (env or {}).items()),
            kwargs=kwargs,
            visible_gpus=visible_gpus,
        )

    # -- validation -------------------------------------------------------

    def validate(self, call_check: Callable[[dict[str, object]], None] | None = None) -> Validated:
        """Check the form once, every wrong field at once; ``call_check(kwargs)`` raises
        ``TypeError`` or ``ValueError`` when the function cannot take the form's keywords."""
        options, errors = self._parse()
        try:
            kwargs = parse_kwargs(self.kwargs)
            if call_check is not None:
                with PANEL.speaking():
                    call_check(kwargs)
        except (TypeError, ValueError) as exc:
            errors["kwargs"] = str(exc)
            kwargs = {}
        for name, value in options.items():
            try:
                with PANEL.speaking():
                    check_option(name, value)
            except ConfigError as exc:
                errors[name] = str(exc)
        config = _build(options, errors)
        order = [*FORM, "launch"]
        errors = dict(sorted(errors.items(), key=lambda e: order.index(e[0])))
        return Validated(errors, config if not errors else None, kwargs)

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
                return {}, {"device": "no GPU is visible to this notebook; choose CPU processes"}
            if not self.gpus:
                return {}, {"gpus": "choose at least one GPU"}
            every = tuple(range(self.visible_gpus))
            return {"gpus": len(self.gpus) if self.gpus == every else list(self.gpus)}, {}
        # str(): a count given as a number reads as the same text.
        typed = str(self.procs)
        text = typed.strip()
        if not _WHOLE.match(text) or not 1 <= int(text) <= MAX_PROCS:
            return {}, {"procs": f"a whole number, e.g. 2 (from 1 to {MAX_PROCS}); got {typed!r}"}
        return {"procs": int(text)}, {}


def _build(options: LaunchOptions, errors: dict[str, str]) -> LaunchConfig | None:
    """The launch from the fields that parsed and passed their own checks, built even while
    others are wrong so that a field only the launch judges (``_JUDGED_BY_LAUNCH``) is flagged
    with them. Any other error is a combination's: it goes to ``launch``, when no field is wrong."""
    valid = cast(LaunchOptions, {k: v for k, v in options.items() if k not in errors})
    for _ in range(len(_JUDGED_BY_LAUNCH) + 1):
        try:
            with PANEL.speaking():
                return LaunchConfig.build(**valid)
        except ConfigError as exc:
            option = exc.option if isinstance(exc, OptionError) else ""
            if option not in _JUDGED_BY_LAUNCH & valid.keys():
                if not errors:
                    errors["launch"] = str(exc)
                return None
            errors[option] = str(exc)
            del valid[option]  # type: ignore[misc]
    return None


def _initial_devices(
    visible_gpus: int, options: LaunchOptions
) -> tuple[DeviceChoice, tuple[int, ...], str]:
    """(device, GPUs chosen, process count) for ``options``, else the machine's default."""
    procs, gpus = options.get("procs"), options.get("gpus")
    if procs is not None:
        return "cpu", tuple(range(visible_gpus)), str(procs)
    if isinstance(gpus, int):
        return "gpu", tuple(range(gpus)), PanelSettings.procs
    if gpus is not None:
        return "gpu", tuple(int(g) for g in gpus), PanelSettings.procs
    return ("gpu" if visible_gpus else "cpu"), tuple(range(visible_gpus)), PanelSettings.procs


def parse_kwargs(text: str) -> dict[str, object]:
    """``epochs=3, lr=0.1`` (entries between commas or lines, empty ones skipped) as keyword
    arguments of Python literals; ``ValueError`` naming the entry that is wrong and why."""
    kwargs: dict[str, object] = {}
    entries = [entry.strip() for entry in _entries(text)]
    for number, entry in enumerate((e for e in entries if e), 1):
        name, sep, value = (part.strip() for part in entry.partition("="))
        where = f"entry {number} ({entry})"
        if not sep:
            raise ValueError(f"{where}: write NAME=VALUE, e.g. epochs=3")
        if not name.isidentifier() or keyword.iskeyword(name):
            raise ValueError(f"{where}: {name!r} is not a Python argument name")
        if not value:
            raise ValueError(f"{where}: no value after =; e.g. {name}=3")
        if name in kwargs:
            raise ValueError(f"{where}: {name} is given twice")
        try:
            kwargs[name] = ast.literal_eval(value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            raise ValueError(
                f"{where}: {value} is not a Python literal; write a number, a string in "
                "quotes, True, False, None, or a list, tuple or dict of them (give other "
                "objects to nbddp.panel itself)"
            ) from None
    return kwargs


def _entries(text: str) -> list[str]:
    """``text`` split at the commas and line ends outside brackets and quotes."""
    entries: list[str] = []
    start = depth = i = 0
    quote = ""
    while i < len(text):
        char = text[i]
        if quote:
            if char == "\\":
                i += 2
                continue
            if text.startswith(quote, i):
                i += len(quote)
                quote = ""
                continue
        elif char in "'\"":
            quote = char * 3 if text.startswith(char * 3, i) else char
            i += len(quote)
            continue
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif depth <= 0 and char in ",\n":
            entries.append(text[start:i])
            start = i + 1
        i += 1
    if quote or depth > 0:
        raise ValueError(f"{text.strip()}: a bracket or quote is not closed")
    entries.append(text[start:])
    return entries


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
    try:  # a whole number stays one, so that a message quotes it as typed
        seconds = int(text) if _WHOLE.match(text.lstrip("-")) else float(text)
    except ValueError:
        raise ValueError(f"seconds (e.g. 600), or empty for none; got {text!r}") from None
    if not math.isfinite(seconds):
        raise ValueError(f"a positive number of seconds, or empty for none; got {text!r}")
    return seconds


def _count(empty: int, wanted: str) -> Callable[[str], int]:
    """A parser of a whole number, ``empty`` when the field is; ``wanted`` says what it takes."""

    def parse(text: str) -> int:
        text = text.strip()
        if text and not text.isdigit():
            raise ValueError(f"{wanted}; got {text!r}")
        return int(text) if text else empty

    return parse


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


_PARSERS: dict[str, Callable[[str], object]] = {
    "nodes": _count(1, "a number of machines (1 or more), or empty for this one"),
    "cluster": lambda text: text.strip() or None,
    "start_method": str,
    "port": _port,
    "timeout": _timeout,
    "max_restarts": _count(0, "a whole number of restarts (0 or more), or empty for none"),
    "env": _env,
    "mixed_precision": str,
}
"""The form's text fields (in the order the code shows them): text to option value."""
