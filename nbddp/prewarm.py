"""Warming up at import: the forkserver and the notebook's store support start early.

Contract: ``start()`` runs once when ``nbddp`` is imported in a notebook or a
script (never in nbddp's own processes), unless ``NBDDP_PREWARM=0``
(``settings.prewarm_wanted``). It starts the forkserver in the background (torch
preloaded, CUDA untouched), so that the first launch finds it ready; in an
interactive session (a Jupyter kernel, IPython, ``python -i``, the REPL) it
also imports, on a daemon thread, what the first launch needs in the notebook:
nbddp's launch machinery (``import nbddp`` loads it lazily) and
``torch.distributed``, for the store the notebook hosts. ``shutdown()`` stops
the forkserver (it is also stopped at interpreter exit:
``launcher.forkserver_link``).

Why these warm up only in an interactive session: there the user's pause
before the first launch pays for them. A script goes on at
once, so a launch soon waits for the same import anyway, while an exit
during that import in a thread waits for it (the thread holds the GIL while
it loads torch's libraries) and can print torch's finalizer errors.
"""

from __future__ import annotations

import sys
import threading

from nbddp.launcher.forkserver_link import FORKSERVER


def shutdown() -> None:
    """Stop nbddp's background forkserver (it restarts on the next launch)."""
    FORKSERVER.close()


def _import_launch() -> None:
    try:
        import torch.distributed  # noqa: F401  # seconds to import; never initialises CUDA

        import nbddp.entry  # noqa: F401
    except Exception:
        pass  # e.g. the interpreter is shutting down; a launch imports them again


def interactive() -> bool:
    """Whether a person is at this interpreter: a kernel, IPython or the REPL."""
    return "IPython" in sys.modules or hasattr(sys, "ps1") or bool(sys.flags.interactive)


def start() -> None:
    """Warm up in the notebook or a script (see module contract)."""
    FORKSERVER.prewarm()
    if interactive():
        threading.Thread(target=_import_launch, name="nbddp-prewarm", daemon=True).start()
