"""nbddp: run multi-GPU (or multi-CPU) PyTorch training from a notebook.

Public API only; see README.md. Importing nbddp in a notebook or script
starts the forkserver in the background (torch preloaded, CUDA untouched)
so the first launch is fast; set ``NBDDP_PREWARM=0`` to opt out.
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nbddp.errors import (
    ConfigError,
    LaunchTimeout,
    NbddpError,
    PayloadError,
    RankError,
    RankExitedError,
    WorkerError,
)
from nbddp.launcher.config import LaunchConfig
from nbddp.launcher.entry import Launcher, launch, notebook_launcher, spawn
from nbddp.launcher.run import Run, RunResult
from nbddp.launcher.starters import FORKSERVER
from nbddp.rank.metrics import log

if TYPE_CHECKING:
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
    "Run",
    "RunResult",
    "WorkerError",
    "launch",
    "load_ipython_extension",
    "log",
    "notebook_launcher",
    "panel",
    "shutdown",
    "spawn",
    "unload_ipython_extension",
]

__version__ = "0.1.0"


def shutdown() -> None:
    """Stop nbddp's background forkserver (it restarts on the next launch)."""
    FORKSERVER.close()


def panel(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Panel:
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


def _import_store_support() -> None:
    # The notebook hosts each run's rendezvous store, which needs torch.distributed
    # (seconds to import; never initialises CUDA). Importing it in the background
    # now keeps that off the first launch.
    try:
        import torch.distributed  # noqa: F401
    except Exception:
        pass  # e.g. the interpreter is shutting down; a launch imports it again


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext nbddp``: register ``%%ddp``, ``%ddp_config`` and ``%ddp_status``."""
    # Imported here: importing nbddp must not import IPython (ranks import it).
    from nbddp.notebook.magics import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    """``%unload_ext nbddp``: remove the magics."""
    from nbddp.notebook.magics import unload_ipython_extension as unload

    unload(ipython)


def _prewarm() -> None:
    # Only the notebook (or script) prewarms: never a worker or the forkserver itself.
    if os.environ.get("NBDDP_ROLE") or os.environ.get("NBDDP_PREWARM", "1") == "0":
        return
    FORKSERVER.prewarm()
    threading.Thread(target=_import_store_support, name="nbddp-prewarm", daemon=True).start()


atexit.register(shutdown)
_prewarm()
