"""What a new process can be given: the notebook's working directory, and an environment ``execve``
takes (``E2BIG`` otherwise)."""

from __future__ import annotations

import os
from collections.abc import Mapping

from nbddp.errors import ConfigError

MAX_ARG_STRLEN = 32 * os.sysconf("SC_PAGE_SIZE")
ARG_MAX = os.sysconf("SC_ARG_MAX")
MARGIN = 8192  # bytes kept for what the starter adds (argv, PYTHONPATH, nbddp's variables)


def working_directory() -> str:
    """The notebook's working directory, which every rank starts in."""
    try:
        return os.getcwd()
    except FileNotFoundError:
        raise ConfigError(
            "the notebook's working directory no longer exists (deleted or moved); "
            "os.chdir() to a directory that exists, then launch again"
        ) from None


def _size(key: str, value: str) -> int:
    """Bytes of ``KEY=value`` as ``execve`` copies it, with its NUL."""
    return len(os.fsencode(key)) + len(os.fsencode(value)) + 2


def fits_exec(key: str, value: str) -> bool:
    """Whether one variable alone can be handed to a new program."""
    return _size(key, value) <= MAX_ARG_STRLEN


def exec_env_problem(env: Mapping[str, str]) -> str | None:
    """Why ``env`` cannot be handed to a new program (spawn, the forkserver), in one line
    naming the variable (Linux's ``E2BIG`` names none), or None."""
    sizes = {key: _size(key, value) for key, value in env.items()}
    for key, size in sizes.items():
        if size > MAX_ARG_STRLEN:
            return (
                f"environment variable {key} is {size - len(key) - 2} bytes, more than a "
                f"new process can be given ({MAX_ARG_STRLEN - 1})"
            )
    pointer = 8  # each string's entry in envp
    total = sum(sizes.values()) + pointer * len(sizes)
    if total > ARG_MAX - MARGIN:
        largest = max(sizes, key=sizes.__getitem__)
        return (
            f"the environment is {total} bytes in all, more than a new process can be "
            f"given ({ARG_MAX - MARGIN}; the largest variable is {largest}, {sizes[largest]} bytes)"
        )
    return None
