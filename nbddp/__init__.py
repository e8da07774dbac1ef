"""nbddp: run multi-GPU (or multi-CPU) PyTorch training from a notebook.

Public API only; see README.md. Importing nbddp in a notebook or script
starts the forkserver in the background (torch preloaded, CUDA untouched)
so the first launch is fast; set ``NBDDP_PREWARM=0`` to opt out.
"""

from collections.abc import Callable as _Callable
from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

from nbddp.cluster.spec import RayCluster
from nbddp.errors import (
    ConfigError,
    LaunchTimeout,
    NbddpError,
    PayloadError,
    RankError,
    RankExitedError,
    ResultError,
    SessionError,
    WorkerError,
)
from nbddp.launcher.config import LaunchConfig
from nbddp.launcher.entry import Launcher, launch, notebook_launcher, spawn
from nbddp.launcher.prewarm import shutdown
from nbddp.launcher.prewarm import start as _prewarm_start
from nbddp.launcher.run import Run, RunResult, UnloadedValue
from nbddp.notebook.session import Session, session
from nbddp.rank.metrics import log

if _TYPE_CHECKING:
    from nbddp.notebook.panel.panel import Panel

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
    "ResultError",
    "Run",
    "RunResult",
    "Session",
    "SessionError",
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


def panel(fn: _Callable[..., _Any], *args: _Any, **kwargs: _Any) -> "Panel":
    """Show a widget panel that launches ``fn(*args, **kwargs)`` on every rank.

    The panel sets the devices (visible GPUs, or CPU processes), start
    method, port, mixed precision, timeout and extra environment; Launch
    runs in the background while the panel shows each rank's state, output
    and ``nbddp.log`` charts; Stop ends every rank. The returned ``Panel``
    has the latest run as ``.run``, and ``launch()``, ``stop()``, ``wait()``,
    ``code()`` and ``close()`` for the same from code. Needs ipywidgets
    (``pip install ipywidgets``); shown only in a Jupyter kernel.
    """
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        raise ImportError(
            "nbddp.panel needs ipywidgets: pip install ipywidgets (or nbddp[panel])"
        ) from None
    from nbddp.notebook.panel.cells import show_panel

    return show_panel(fn, args, kwargs)


def load_ipython_extension(ipython: _Any) -> None:
    """``%load_ext nbddp``: register ``%%ddp``, ``%ddp_config`` and ``%ddp_status``."""
    # Imported here: importing nbddp must not import IPython (ranks import it).
    from nbddp.notebook.magics import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython: _Any) -> None:
    """``%unload_ext nbddp``: remove the magics."""
    from nbddp.notebook.magics import unload_ipython_extension as unload

    unload(ipython)


_prewarm_start()
