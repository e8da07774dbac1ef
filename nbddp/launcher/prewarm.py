"""Warming up at import: the forkserver and the notebook's store support start early.

Contract: ``start()`` is called once when ``nbddp`` is imported. In the
notebook (or a script) it starts the forkserver in the background (torch
preloaded, CUDA untouched), so that the first launch finds it ready. In an
interactive session (a Jupyter kernel, IPython, ``python -i`` or the REPL)
it also imports ``torch.distributed`` on a daemon thread, for the store the
notebook hosts. It does nothing inside nbddp's own processes
(``NBDDP_ROLE`` is set there) or with ``NBDDP_PREWARM=0``. ``shutdown()``
stops the forkserver and is registered to run at interpreter exit: a
forkserver that was never asked to start a rank is killed, not waited for,
so a script that imports nbddp and never launches exits at once.

Why the store support warms up only in an interactive session: there the
user's pause before the first launch pays for it. A script goes on at
once, so a launch soon waits for the same import anyway (usually torch is
imported by the script itself first), while an exit during that import in
a thread waits for it (the thread holds the GIL while it loads torch's
libraries) and can print torch's finalizer errors.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading

from nbddp.launcher.starters import FORKSERVER


def shutdown() -> None:
    """Stop nbddp's background forkserver (it restarts on the next launch)."""
    FORKSERVER.close()


def _import_store_support() -> None:
    # The notebook hosts each run's rendezvous store, which needs torch.distributed
    # (seconds to import; never initialises CUDA). Importing it in the background
    # now keeps that off the first launch.
    try:
        import torch.distributed  # noqa: F401
    except Exception:
        pass  # e.g. the interpreter is shutting down; a launch imports it again


def interactive() -> bool:
    """Whether a person is at this interpreter: a kernel, IPython or the REPL."""
    return "IPython" in sys.modules or hasattr(sys, "ps1") or bool(sys.flags.interactive)


def start() -> None:
    """Prewarm in the notebook or a script (see module contract)."""
    atexit.register(shutdown)
    if os.environ.get("NBDDP_ROLE") or os.environ.get("NBDDP_PREWARM", "1") == "0":
        return
    FORKSERVER.prewarm()
    if interactive():
        threading.Thread(target=_import_store_support, name="nbddp-prewarm", daemon=True).start()
