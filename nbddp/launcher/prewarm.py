"""Warming up at import: the forkserver and the notebook's store support start early.

Contract: ``start()`` runs once when ``nbddp`` is imported in a notebook or a
script (never in nbddp's own processes), unless ``NBDDP_PREWARM=0``
(``launcher.settings``). It starts the forkserver in the background (torch
preloaded, CUDA untouched), so that the first launch finds it ready; in an
interactive session (a Jupyter kernel, IPython, ``python -i``, the REPL) it
also imports ``torch.distributed`` on a daemon thread, for the store the
notebook hosts. ``shutdown()`` stops the forkserver (it is also stopped at
interpreter exit: ``starters.ForkserverStarter``).

Why the store support warms up only in an interactive session: there the
user's pause before the first launch pays for it. A script goes on at
once, so a launch soon waits for the same import anyway, while an exit
during that import in a thread waits for it (the thread holds the GIL while
it loads torch's libraries) and can print torch's finalizer errors.
"""

from __future__ import annotations

import sys
import threading

from nbddp.launcher.forkserver_link import FORKSERVER
from nbddp.launcher.settings import prewarm_wanted


def shutdown() -> None:
    """Stop nbddp's background forkserver (it restarts on the next launch)."""
    FORKSERVER.close()


def _import_store_support() -> None:
    try:
        import torch.distributed  # noqa: F401  # seconds to import; never initialises CUDA
    except Exception:
        pass  # e.g. the interpreter is shutting down; a launch imports it again


def interactive() -> bool:
    """Whether a person is at this interpreter: a kernel, IPython or the REPL."""
    return "IPython" in sys.modules or hasattr(sys, "ps1") or bool(sys.flags.interactive)


def start() -> None:
    """Warm up in the notebook or a script (see module contract)."""
    if not prewarm_wanted():
        return
    FORKSERVER.prewarm()
    if interactive():
        threading.Thread(target=_import_store_support, name="nbddp-prewarm", daemon=True).start()
