"""The environment variables nbddp sets for each rank, which ``env=`` may not override.

``check_env(env, sets)`` raises a one-line ``OptionError`` for the first
variable of ``env`` in ``sets`` (what ``LaunchConfig.rank_env`` gives a rank of
that launch), naming the option to use instead. ``USER_MAY_SET`` are the
variables nbddp only defaults (``OMP_NUM_THREADS``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

from nbddp.launcher.spelling import OptionError, Spelling

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
    """Raise ``OptionError`` for the first variable of ``env`` that nbddp sets (``sets``)."""
    refused = [(k, v) for k, v in env.items() if k in sets and k not in USER_MAY_SET]
    if refused:
        key, value = refused[0]
        raise OptionError("env", env, lambda s: reason(key, value, s))
