"""Warming up at import: the forkserver and the notebook's store support start early.

Contract: ``start()`` is called once when ``nbddp`` is imported. In the
notebook (or a script) it starts the forkserver in the background (torch
preloaded, CUDA untouched) and imports ``torch.distributed`` on a daemon
thread, so that the first launch finds both ready; it does nothing inside
nbddp's own processes (``NBDDP_ROLE`` is set there) or with
``NBDDP_PREWARM=0``. ``shutdown()`` stops the forkserver and is registered
to run at interpreter exit.
"""

from __future__ import annotations

import atexit
import os
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


def start() -> None:
    """Prewarm in the notebook or a script (see module contract)."""
    atexit.register(shutdown)
    if os.environ.get("NBDDP_ROLE") or os.environ.get("NBDDP_PREWARM", "1") == "0":
        return
    FORKSERVER.prewarm()
    threading.Thread(target=_import_store_support, name="nbddp-prewarm", daemon=True).start()
