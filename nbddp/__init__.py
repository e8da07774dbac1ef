"""nbddp: run multi-GPU (or multi-CPU) PyTorch training from a notebook.

Public API only. Each name loads its module on first use (PEP 562), so a rank importing nbddp
for ``nbddp.log`` loads the rank's side alone. In a notebook or script, importing nbddp starts
the forkserver in the background (``NBDDP_PREWARM=0`` opts out).
"""

import importlib as _importlib
import os as _os
from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

if _TYPE_CHECKING:
    from collections.abc import Callable

    from nbddp.entry import Launcher, launch, notebook_launcher, spawn
    from nbddp.errors import (
        ConfigError,
        LaunchTimeout,
        NbddpError,
        PayloadError,
        RankError,
        RankExitedError,
        RemoteError,
        ResultError,
        SessionError,
        WorkerError,
    )
    from nbddp.launcher.clusters import RayCluster, SlurmCluster
    from nbddp.launcher.config import LaunchConfig
    from nbddp.launcher.run import Run, RunResult, UnloadedValue
    from nbddp.notebook.panel.panel import Panel
    from nbddp.notebook.session import Session, session
    from nbddp.prewarm import shutdown
    from nbddp.rank.metrics import log

_HOMES = {
    name: home
    for home, names in (
        ("nbddp.errors", "ConfigError LaunchTimeout NbddpError PayloadError RankError"),
        ("nbddp.errors", "RankExitedError ResultError SessionError RemoteError WorkerError"),
        ("nbddp.launcher.config", "LaunchConfig"),
        ("nbddp.entry", "Launcher launch notebook_launcher spawn"),
        ("nbddp.launcher.clusters", "RayCluster SlurmCluster"),
        ("nbddp.launcher.run", "Run RunResult UnloadedValue"),
        ("nbddp.notebook.session", "Session session"),
        ("nbddp.rank.metrics", "log"),
        ("nbddp.prewarm", "shutdown"),
    )
    for name in names.split()
}
"""Each lazily loaded public name, and the module that defines it."""

__all__ = [
    "ConfigError",
    "LaunchConfig",
    "LaunchTimeout",
    "Launcher",
    "NbddpError",
    "PayloadError",
    "RankError",
    "RankExitedError",
    "RayCluster",
    "RemoteError",
    "ResultError",
    "Run",
    "RunResult",
    "Session",
    "SessionError",
    "SlurmCluster",
    "UnloadedValue",
    "WorkerError",
    "launch",
    "load_ipython_extension",
    "log",
    "notebook_launcher",
    "panel",
    "session",
    "shutdown",
    "spawn",
    "unload_ipython_extension",
]

__version__ = "0.1.0"


def __getattr__(name: str) -> _Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'nbddp' has no attribute {name!r}")
    value = getattr(_importlib.import_module(home), name)
    globals()[name] = value  # loaded once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


def panel(fn: "Callable[..., _Any]", *args: _Any, **kwargs: _Any) -> "Panel":
    """Show a widget panel that launches ``fn(*args, **kwargs)`` on every rank.

    The panel sets the devices (visible GPUs, or CPU processes), start
    method, port, mixed precision, timeout and extra environment; Launch
    runs in the background while the panel shows each rank's state, output
    and ``nbddp.log`` charts; Stop ends every rank. The returned ``Panel``
    has the latest run as ``.run``, and ``launch()``, ``stop()``, ``wait()``,
    ``code()`` and ``close()`` for the same from code. Needs ipywidgets
    (``pip install "nbddp[panel]"``); shown only in a Jupyter kernel.
    """
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        raise ImportError(
            "nbddp.panel needs ipywidgets: pip install 'nbddp[panel]' (or ipywidgets)"
        ) from None
    from nbddp.notebook.panel.cells import show_panel

    return show_panel(fn, args, kwargs)


def load_ipython_extension(ipython: _Any) -> None:
    """``%load_ext nbddp``: register ``%%ddp``, ``%ddp_config``, ``%ddp_session``,
    ``%ddp_status``, ``%ddp_debug`` and ``%ddp_panel``."""
    from nbddp.notebook.magics import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython: _Any) -> None:
    """``%unload_ext nbddp``: remove the magics."""
    from nbddp.notebook.magics import unload_ipython_extension as unload

    unload(ipython)


if not _os.environ.get("NBDDP_ROLE"):  # a notebook or a script, not nbddp's own processes
    from nbddp.launcher.settings import prewarm_wanted as _prewarm_wanted

    if _prewarm_wanted():
        from nbddp.prewarm import start as _prewarm

        _prewarm()
