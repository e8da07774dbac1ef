"""Warming up at import: the forkserver and the notebook's store support start early.

``start()`` runs once when ``nbddp`` is imported in a notebook or script (never in nbddp's own
processes) unless ``NBDDP_PREWARM=0``: it starts the forkserver in the background, and in an
interactive session also imports the launch machinery and ``torch.distributed`` on a daemon
thread (the user's pause pays for it; a script would soon wait for it anyway, and exiting during
that import can print torch's finalizer errors). ``shutdown()`` stops the forkserver.
"""

from __future__ import annotations

import functools
import os
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
    """Start the forkserver; in an interactive session, import the launch side too."""
    FORKSERVER.prewarm()
    if interactive():
        thread = threading.Thread(target=_import_launch, name="nbddp-prewarm", daemon=True)
        thread.start()
        # Why a fork waits for these imports (bounded): a child forked mid-import would find
        # the module's lock held forever by this thread, which the child lacks.
        os.register_at_fork(before=functools.partial(thread.join, 60))
