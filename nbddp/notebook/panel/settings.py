"""The panel's settings form as plain data: validation and the equivalent code.

Contract: ``PanelSettings`` holds what the form's fields hold, as the user
typed it (text fields stay text). ``errors()`` maps each invalid field to a
one-line message that says what to type instead, and is empty exactly when
``options()`` returns ``LaunchConfig.build`` keywords that build. The code
renderers turn valid settings into the ``%%ddp`` cell and the ``launch(...)``
call that run the same thing, so a configuration found by clicking becomes
code. Nothing here imports ipywidgets, starts a process or touches CUDA.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from nbddp.errors import ConfigError
from nbddp.launcher.config import LaunchConfig
from nbddp.notebook.runner import format_options

DeviceChoice = Literal["gpu", "cpu"]
START_METHODS = ("forkserver", "spawn", "fork")
PRECISIONS = ("no", "fp16", "bf16", "fp8")
MAX_PROCS = 256  # a typo guard: more CPU ranks than this is never what was meant
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_LITERAL_TYPES = (bool, int, float, str, bytes, type(None))
_MAX_ARG_REPR = 60

FIELDS = ("device", "gpus", "procs", "start_method", "port", "mixed_precision", "timeout", "env")
"""The form's fields, in display order (``errors()`` keys are among these, or ``launch``)."""


@dataclass(frozen=True)
class PanelSettings:
    """What the panel's form holds (see module contract)."""

    device: DeviceChoice = "cpu"
    gpus: tuple[int, ...] = ()
    """Notebook GPU ordinals chosen (device ``gpu``)."""
    procs: int = 2
    """CPU processes (device ``cpu``)."""
    start_method: str = "forkserver"
    port: str = ""
    """Rendezvous port as typed; empty: a free one per run."""
    mixed_precision: str = "no"
    timeout: str = ""
    """Seconds as typed; empty: no timeout."""
    env: str = ""
    """Extra environment variables, one ``NAME=VALUE`` per line."""
    visible_gpus: int = field(default=0, compare=False)
    """How many GPUs the notebook sees (detected without initialising CUDA)."""

    @classmethod
    def initial(cls, visible_gpus: int, options: Mapping[str, Any] | None = None) -> PanelSettings:
        """Defaults for a machine with ``visible_gpus`` GPUs, overlaid with ``options``
        (``LaunchConfig.build`` keywords, e.g. a ``%ddp_config`` session's defaults)."""
        settings = cls(
            device="gpu" if visible_gpus else "cpu",
            gpus=tuple(range(visible_gpus)),
            visible_gpus=visible_gpus,
        )
        if not options:
            return settings
        changes: dict[str, Any] = {}
        gpus = options.get("gpus")
        if options.get("procs") is not None:
            changes.update(device="cpu", procs=int(options["procs"]))
        elif isinstance(gpus, int):
            changes.update(device="gpu", gpus=tuple(range(gpus)))
        elif gpus is not None:
            changes.update(device="gpu", gpus=tuple(int(g) for g in gpus))
        for key in ("start_method", "mixed_precision"):
            if options.get(key) is not None:
                changes[key] = str(options[key])
        for key in ("port", "timeout"):
            if options.get(key) is not None:
                changes[key] = f"{options[key]:g}" if key == "timeout" else str(options[key])
        if options.get("env"):
            changes["env"] = "\n".join(f"{k}={v}" for k, v in options["env"].items())
        return replace(settings, **changes)

    # -- validation -------------------------------------------------------

    def errors(self) -> dict[str, str]:
        """Field -> what is wrong with it; empty when every field is valid.

        Field checks come first; if they pass, the whole configuration is
        built once more, and a problem only the combination shows is
        reported under ``launch``.
        """
        errors: dict[str, str] = {}
        if self.device == "gpu":
            if not self.visible_gpus:
                errors["device"] = "no GPU is visible to this notebook; choose CPU"
            elif not self.gpus:
                errors["gpus"] = "choose at least one GPU"
        elif not 1 <= self.procs <= MAX_PROCS:
            errors["procs"] = f"a number of processes from 1 to {MAX_PROCS}"
        if self.start_method not in START_METHODS:
            errors["start_method"] = f"one of {', '.join(START_METHODS)}"
        if self.mixed_precision not in PRECISIONS:
            errors["mixed_precision"] = f"one of {', '.join(PRECISIONS)}"
        for name, check in (("port", _port), ("timeout", _timeout), ("env", _env)):
            try:
                check(getattr(self, name))
            except ValueError as exc:
                errors[name] = str(exc)
        if not errors:
            try:
                LaunchConfig.build(**self.options())
            except ConfigError as exc:
                errors["launch"] = str(exc)
        return errors

    def options(self) -> dict[str, Any]:
        """The settings as ``LaunchConfig.build`` keywords (only what differs from the
        defaults). Raises ``ValueError`` on a field ``errors()`` reports."""
        options: dict[str, Any] = {}
        if self.device == "gpu":
            every = tuple(range(self.visible_gpus))
            options["gpus"] = len(self.gpus) if self.gpus == every else list(self.gpus)
        else:
            options["procs"] = self.procs
        if self.start_method != "forkserver":
            options["start_method"] = self.start_method
        port = _port(self.port)
        if port is not None:
            options["port"] = port
        timeout = _timeout(self.timeout)
        if timeout is not None:
            options["timeout"] = timeout
        env = _env(self.env)
        if env:
            options["env"] = env
        if self.mixed_precision != "no":
            options["mixed_precision"] = self.mixed_precision
        return options

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


def call_code(args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[str, bool]:
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


def _port(text: str) -> int | None:
    text = text.strip()
    if not text or text.lower() == "auto":
        return None
    try:
        port = int(text)
    except ValueError:
        raise ValueError(f"a port number (1-65535), or empty for any; got {text!r}") from None
    if not 1 <= port <= 65535:
        raise ValueError(f"a port number from 1 to 65535, or empty for a free one; got {port}")
    return port


def _timeout(text: str) -> float | None:
    text = text.strip()
    if not text or text.lower() == "none":
        return None
    try:
        seconds = float(text)
    except ValueError:
        raise ValueError(f"seconds (e.g. 600), or empty for none; got {text!r}") from None
    if not seconds > 0 or seconds == float("inf"):
        raise ValueError(f"a positive number of seconds, or empty for none; got {text!r}")
    return seconds


def _env(text: str) -> dict[str, str]:
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
    return env
