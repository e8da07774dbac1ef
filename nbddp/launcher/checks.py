"""Each launch option's value, checked on its own, before any process starts.

``Values.check(options)`` returns every launch option as its checked, typed value, or raises
``OptionError`` for the first wrong in itself, saying what to do; ``check_option(name, value)``
checks one (the panel's fields). Combinations (gpus and procs, GPUs not visible) are
``LaunchConfig.build``'s. ``env=`` may not override a variable nbddp sets for each rank
(``check_env``); its error names the option to use instead.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar, cast

from nbddp.launcher.clusters import Cluster, as_cluster
from nbddp.launcher.options import (
    DEFAULTS,
    OPTIONS,
    Backend,
    LaunchOptions,
    MixedPrecision,
    StartMethod,
)
from nbddp.launcher.options import Output as OutputChoice
from nbddp.launcher.spelling import OptionError, Spelling

S = TypeVar("S", bound=str)


@dataclass(frozen=True)
class Values:
    """Every launch option's value, each checked on its own."""

    gpus: int | tuple[int, ...] | None
    procs: int | None
    start_method: StartMethod
    port: int | None
    master_addr: str
    timeout: float | None
    env: dict[str, str]
    mixed_precision: MixedPrecision
    backend: Backend | None
    init_process_group: bool
    debug: bool
    max_restarts: int
    output: OutputChoice
    tail: int
    nodes: int
    cluster: Cluster | None

    @classmethod
    def check(cls, options: LaunchOptions) -> Values:
        """Raise ``OptionError`` for the first option whose value is wrong in itself."""
        procs, backend = options["procs"], options["backend"]
        return cls(
            gpus=gpu_request(options["gpus"]),
            procs=None if procs is None else positive_int("procs", procs),
            start_method=choice("start_method", options["start_method"]),
            port=port(options["port"]),
            master_addr=master_addr(options["master_addr"]),
            timeout=seconds("timeout", options["timeout"]),
            env=environment(options["env"]),
            mixed_precision=choice("mixed_precision", _lower(options["mixed_precision"])),
            backend=None if backend is None else choice("backend", backend),
            init_process_group=bool(options["init_process_group"]),
            debug=bool(options["debug"]),
            max_restarts=restarts(options["max_restarts"]),
            output=choice("output", options["output"]),
            tail=tail(options["tail"]),
            nodes=positive_int("nodes", options["nodes"]),
            cluster=cluster(options["cluster"]),
        )


def check_option(name: str, value: object) -> None:
    """Raise ``OptionError`` if ``value`` is wrong for option ``name`` in itself."""
    if name not in OPTIONS:
        raise ValueError(f"no launch option is named {name!r}")
    Values.check(cast(LaunchOptions, {**DEFAULTS, name: value}))


def positive_int(option: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise OptionError(
            option,
            value,
            lambda s: f"{s.name(option)} must be a positive whole number, got {value!r}",
        )
    if value < 1:
        raise OptionError(
            option, value, lambda s: f"{s.name(option)} must be at least 1, got {value}"
        )
    return value


def gpu_request(gpus: object) -> int | tuple[int, ...] | None:
    """A GPU count, or GPU ids (notebook ordinals), as far as they can be checked alone."""
    if gpus is None:
        return None
    if isinstance(gpus, str):
        raise OptionError(
            "gpus",
            gpus,
            lambda s: (
                f"{s.name('gpus')} must be a count or a list of GPU ids such as "
                f"{s.given('gpus', [0, 1])}, got the string {gpus!r}"
            ),
        )
    if isinstance(gpus, int) and not isinstance(gpus, bool):
        return positive_int("gpus", gpus)
    if not isinstance(gpus, Iterable):
        raise OptionError(
            "gpus",
            gpus,
            lambda s: f"{s.name('gpus')} must be a count or a list of GPU ids, got {gpus!r}",
        )
    ids = list(gpus)
    if not ids:
        raise OptionError(
            "gpus",
            ids,
            lambda s: (
                f"{s.given('gpus', [])} selects no GPU; give at least one id, "
                f"or use {s.hole('procs', 'N')} for CPU"
            ),
        )
    for gid in ids:
        _gpu_id(ids, gid)
    if len(set(ids)) != len(ids):
        raise OptionError("gpus", ids, lambda s: f"{s.name('gpus')} lists a GPU twice: {ids}")
    return tuple(ids)


def _gpu_id(ids: list[object], gid: object) -> None:
    if isinstance(gid, bool) or not isinstance(gid, int) or gid < 0:
        raise OptionError(
            "gpus", ids, lambda s: f"GPU ids must be non-negative whole numbers, got {gid!r}"
        )


def choice(option: str, value: S) -> S:
    """``value`` if it is one of option ``option``'s choices (its ``Literal`` type)."""
    allowed = OPTIONS[option].choices
    if value not in allowed:
        raise OptionError(
            option,
            value,
            lambda s: f"unknown {s.name(option)} {value!r}; choose one of {', '.join(allowed)}",
        )
    return value


def _lower(value: S) -> S:
    # "BF16" means bf16 (accelerate accepts either case).
    return cast(S, value.lower()) if isinstance(value, str) else value


def tail(value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value < 1:
        raise OptionError(
            "tail",
            value,
            lambda s: (
                f"{s.given('tail', value)} shows nothing; use {s.given('tail', 1)} or "
                f"more ({s.given('output', 'none')} hides)"
            ),
        )
    return positive_int("tail", value)


def restarts(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise OptionError(
            "max_restarts",
            value,
            lambda s: (
                f"{s.name('max_restarts')} must be a whole number of restarts (0 or "
                f"more), got {value!r}"
            ),
        )
    return value


def master_addr(addr: object) -> str:
    if not isinstance(addr, str) or not addr.strip():
        raise OptionError(
            "master_addr",
            addr,
            lambda s: f"{s.name('master_addr')} must be a host name or IP address, got {addr!r}",
        )
    return addr.strip()


def port(value: object) -> int | None:
    if value is None:
        return None
    number = int(value.strip()) if isinstance(value, str) and value.strip().isdigit() else value
    if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= 65535:
        raise OptionError(
            "port",
            value,
            lambda s: (
                f"{s.name('port')} must be a number from 1 to 65535 "
                f"(or {s.unset('port')} for any), got {value!r}"
            ),
        )
    return number


def environment(env: Mapping[str, str] | None) -> dict[str, str]:
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise OptionError(
            "env",
            env,
            lambda s: f"{s.name('env')} must be a dict of strings, got {type(env).__name__}",
        )
    return {key: _env_entry(env, key, value) for key, value in env.items()}


def _env_entry(env: Mapping[str, object], key: object, value: object) -> str:
    if not isinstance(key, str) or not key or "=" in key or "\0" in key:
        raise OptionError(
            "env",
            env,
            lambda s: f"{s.name('env')} keys must be non-empty strings without '=', got {key!r}",
        )
    if not isinstance(value, str | int | float) or isinstance(value, bool):
        raise OptionError(
            "env",
            env,
            lambda s: f"{s.env_entry(key, '...')} must be a string, got {type(value).__name__}",
        )
    if "\0" in str(value):
        raise OptionError(
            "env",
            env,
            lambda s: (
                f"{s.env_entry(key, '...')} contains a NUL byte, which no environment "
                "variable can hold; remove it (pass binary data in a file instead)"
            ),
        )
    return str(value)


def seconds(option: str, value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise OptionError(
            option, value, lambda s: f"{s.name(option)} must be a number of seconds, got {value!r}"
        )
    if value <= 0:
        raise OptionError(
            option,
            value,
            lambda s: (
                f"{s.name(option)} must be positive (seconds), got {value}; "
                f"{s.unset(option)} for no limit"
            ),
        )
    return float(value)


def cluster(value: object) -> Cluster | None:
    try:
        return as_cluster(value)
    except ValueError as exc:
        reason = str(exc)
        raise OptionError("cluster", value, lambda s: f"{s.name('cluster')} {reason}") from None


USER_MAY_SET = frozenset({"OMP_NUM_THREADS", "PYTHONUNBUFFERED"})
"""Set by nbddp as a default only: a value in ``env`` wins (thread count, buffering)."""

PER_RANK = frozenset({"RANK", "LOCAL_RANK", "GROUP_RANK", "NODE_RANK", "ROLE_RANK"})
SIZES = frozenset({"WORLD_SIZE", "LOCAL_WORLD_SIZE", "ROLE_WORLD_SIZE"})


def _port(value: str, spell: Spelling) -> str:
    port: object = int(value) if value.strip().isdigit() else value
    return f"use {spell.given('port', port)} instead"


def _devices(value: str, spell: Spelling) -> str:
    if not value.strip():
        return f"use {spell.hole('procs', 'N')} to run on CPU instead"
    return (
        f"use {spell.hole('gpus', 'N')} instead (a count, or GPU ids as this notebook "
        "numbers its GPUs)"
    )


_INSTEAD: Mapping[str, Callable[[str, Spelling], str]] = {
    "MASTER_PORT": _port,
    "MASTER_ADDR": lambda value, spell: f"use {spell.given('master_addr', value)} instead",
    "ACCELERATE_MIXED_PRECISION": lambda value, spell: (
        f"use {spell.given('mixed_precision', value.lower())} instead"
    ),
    "CUDA_VISIBLE_DEVICES": _devices,
    "ACCELERATE_USE_CPU": lambda _value, spell: (
        f"it is set for CPU ranks ({spell.hole('procs', 'N')})"
    ),
}
"""What to give instead of a variable a launch option sets."""


def reason(key: str, value: str, spell: Spelling) -> str:
    """Why ``env`` may not set ``key`` (one of the variables nbddp sets), and what instead."""
    entry = spell.env_entry(key, value)
    if key in PER_RANK:
        return f"{entry}: {key} is per rank and set by nbddp; read it inside the function"
    if key in SIZES:
        counts = f"{spell.hole('gpus', 'N')} or {spell.hole('procs', 'N')}"
        return f"{entry}: nbddp sets {key} itself from the number of ranks; use {counts} instead"
    instead = _INSTEAD.get(key)
    if instead is not None:
        return f"{entry}: nbddp sets {key} itself; {instead(value, spell)}"
    if key.startswith("TORCHELASTIC_"):
        return f"{entry}: nbddp sets {key} itself for its rendezvous; leave it out"
    return f"{entry}: nbddp sets {key} itself; leave it out"


def check_env(env: Mapping[str, str], sets: Collection[str]) -> None:
    """Raise ``OptionError`` for the first variable of ``env`` that nbddp sets (``sets``:
    what ``JobSpec.rank_env`` gives a rank of that launch), in one line."""
    refused = [(k, v) for k, v in env.items() if k in sets and k not in USER_MAY_SET]
    if refused:
        key, value = refused[0]
        raise OptionError("env", env, lambda s: reason(key, value, s))
