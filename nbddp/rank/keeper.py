"""The keeper: the parent of one rank, so that nothing the rank starts outlives it.

Contract: ``keep(run_rank, status_w)`` runs in a freshly forked process that
is already the leader of its own session. It makes itself a child subreaper
(``PR_SET_CHILD_SUBREAPER``), forks the rank (which leads a session of its
own and runs ``run_rank``), writes the rank's pid (8 bytes) to ``status_w``,
and waits. Whatever the rank's descendants do with sessions and process
groups (``setsid``, a double fork), an orphan among them is re-parented to
the keeper, which reaps every one that ends. When the rank has exited, the
keeper kills every descendant still alive (SIGKILL, until none is left),
reaps them, writes the rank's exit code (8 bytes; negative: the signal that
killed it) to ``status_w`` and exits. So when the notebook reads the exit
code, the rank's whole tree is gone, and nothing holds its pipes.

The keeper is the rank's parent, not the forkserver: a rank outlives its
forkserver and its exit code still reaches the notebook. The keeper runs
only this module's code (no user code, no threads) and holds none of the
rank's fds but ``status_w``; it is never in the rank's process group, so
stopping the rank does not stop it, and it ends right after the rank. The
forkserver's keepers (``nbddp.rank.pooled``) do the same with ``supervise``,
then stay for the forkserver's next rank.

A spawned rank's keeper is the interpreter the notebook spawns
(``spawned_main``); it forks the rank before anything imports nbddp, so the
notebook, which waits for each rank's pid in turn, waits for an interpreter's
start only (tenths of a second less per rank). So this module imports only the
standard library at its top, and can run loaded from its file alone.

Non-Linux: without ``PR_SET_CHILD_SUBREAPER``, orphans go to init as before;
the keeper still kills every descendant it can find while their parents live.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import struct
import sys
from collections.abc import Callable, Collection
from typing import NoReturn

PR_SET_CHILD_SUBREAPER = 36
PR_SET_NAME = 15
STATUS = struct.Struct("!q")  # the same 8-byte frame as ``launcher.starters.STATUS``
KEEPER_NAME = "nbddp-keeper"


def set_process_name(name: str) -> None:
    """Name this process (``ps``, ``top``, psutil ``name()``) so that users and tests
    can tell ranks apart; DataLoader workers inherit the name. Linux only; best effort."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)
    except (OSError, AttributeError):
        pass


def become_subreaper() -> bool:
    """Have orphaned descendants re-parented to this process (Linux); False elsewhere."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def keep(run_rank: Callable[[], NoReturn], status_w: int, rank_fds: Collection[int]) -> NoReturn:
    """Fork the rank and stay its parent until its whole tree is gone (see module
    contract); ``rank_fds``: the rank's own fds, which the keeper closes."""
    try:
        become_subreaper()
        rank = os.fork()
        if rank == 0:  # pragma: no cover - runs in the rank
            os.close(status_w)
            os.setsid()
            run_rank()
        for fd in rank_fds:
            os.close(fd)
        supervise(rank, status_w)
    finally:
        os._exit(0)


def spawned_main() -> NoReturn:
    """Entry of a spawned rank's keeper: ``python -c BOOT KEEPER_FILE CTRL OUT ERR STATUS_W``
    (``launcher.starters.SpawnStarter``), in a new session; its stdio is the notebook's.

    It keeps the rank, which points fd 1/2 at ``OUT``/``ERR`` and serves ``CTRL``.
    """
    ctrl, out, err, status_w = (int(arg) for arg in sys.argv[-4:])
    keep(lambda: _spawned_rank(ctrl, out, err), status_w, (ctrl, out, err))


def _spawned_rank(ctrl: int, out: int, err: int) -> NoReturn:  # pragma: no cover - in the rank
    from nbddp.rank import worker  # only here: the rank needs it, its keeper never does

    worker.run_forked(ctrl, out, err)


def supervise(rank: int, status_w: int) -> None:
    """Report ``rank`` (our child) to ``status_w``; when it has exited, end its tree
    and report its exit code."""
    set_process_name(KEEPER_NAME)
    _write(status_w, rank)
    code = wait_for(rank)
    end_descendants()
    _write(status_w, code)
    os.close(status_w)


def wait_for(pid: int) -> int:
    """Reap children (adopted orphans too) until ``pid`` exits; its exit code."""
    while True:
        try:
            done, status = os.waitpid(-1, 0)
        except ChildProcessError:  # pragma: no cover - pid is our child until reaped
            return -signal.SIGKILL
        if done == pid:
            return os.waitstatus_to_exitcode(status)


def _has_children() -> bool:
    """Whether any child (adopted orphans too) is left, reaping those that ended."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True  # one is still running


def end_descendants() -> None:
    """SIGKILL every descendant and reap them, until this process has no child left.

    A killed process's own children are re-parented here (subreaper), so each
    round finds what the last one orphaned; the loop ends when ``waitpid``
    says no child is left."""
    if not _has_children():
        return  # the usual case, and psutil's walk of /proc costs milliseconds
    import psutil  # here, not at the top: a spawned keeper forks its rank first

    while True:
        with contextlib.suppress(psutil.Error):
            for proc in psutil.Process().children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    proc.kill()
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def _write(fd: int, value: int) -> None:
    with contextlib.suppress(OSError):  # the notebook is gone: nobody is waiting
        os.write(fd, STATUS.pack(value))
