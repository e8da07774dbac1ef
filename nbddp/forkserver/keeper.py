"""The keeper: every rank's parent, whatever the start method, so nothing a rank starts outlives it.

A keeper leads its own process group (``setsid``; never the rank's), is a child subreaper, forks
the rank (``become_rank``), writes its pid, then its exit code (``STATUS``) to status_w, only
after SIGKILLing and reaping whatever is left of the rank's tree. It runs no user code and holds
no fd of the rank's but status_w. ``keep``: a one-shot keeper (fork starter; ``spawned_main``,
which imports only the standard library before it forks). ``serve_keeper``: a forkserver's
keeper, reused rank after rank on the orders ``RUN``/``WARM`` on its link, saying ``FREE`` once
a rank's tree is gone; while free, it and its idle worker die with their parent.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import struct
import sys
import traceback
from collections.abc import Collection, Iterator
from typing import NoReturn

from nbddp import prctl

STATUS = struct.Struct("!q")
"""A pid, then an exit code: the frames a keeper writes to its status fd."""
KEEPER_NAME = "nbddp-keeper"
IDLE_NAME = "nbddp-idle"
"""A free keeper, and an idle worker once it is ready."""
WARMING_NAME = "nbddp-warming"
"""An idle worker until it is ready: it has closed what is its keeper's."""
WORKER_NAME = "nbddp-worker"
"""A rank until it knows its number (then ``nbddp-rank<N>``)."""
RUN, WARM, FREE = b"R", b"W", b"F"
RANK_FDS = 4
"""ctrl, out, err and status_w: the fds that come with ``RUN``."""


def detach(close: Collection[int]) -> None:
    """First steps of a forked child: lead its own process group (``setsid``), close
    the parent's fds in ``close``, and take default signal handling."""
    os.setsid()
    for fd in close:
        with contextlib.suppress(OSError):
            os.close(fd)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.set_wakeup_fd(-1)


def keep(status_w: int, ctrl: int, out: int, err: int) -> NoReturn:
    """A one-shot keeper: fork the rank on ``ctrl``, ``out``, ``err`` (closed here once it
    has forked), stay its parent until its tree is gone, exit."""
    try:
        prctl.become_subreaper()
        rank = os.fork()
        if rank == 0:  # pragma: no cover - runs in the rank
            os.close(status_w)
            os.setsid()
            become_rank(ctrl, out, err)
        for fd in (ctrl, out, err):
            os.close(fd)
        supervise(rank, status_w)
    finally:
        os._exit(0)


def spawned_main() -> NoReturn:
    """A spawned keeper: ``python -c ... CTRL OUT ERR STATUS_W`` (the spawn starter),
    leading its own process group, its stdio the notebook's."""
    ctrl, out, err, status_w = (int(arg) for arg in sys.argv[-4:])
    keep(status_w, ctrl, out, err)


def become_rank(ctrl: int, out: int, err: int) -> NoReturn:  # pragma: no cover - in the rank
    """Run the rank in this freshly forked child, on its ctrl, out and err fds; the one way
    every start method starts a rank. Never returns."""
    # Imported only here: a spawned keeper forks before importing torch, and a keeper
    # never needs the rank's modules (the forkserver has preloaded them for its ranks).
    from nbddp.rank import worker

    worker.run_forked(ctrl, out, err)


def supervise(rank: int, status_w: int, then: str = KEEPER_NAME) -> None:
    """Report ``rank`` (a child) to ``status_w``; once it has exited, end its tree, take
    the name ``then`` and report its exit code: when the notebook learns the rank has
    ended, its keeper already says what it is from then on."""
    prctl.set_name(KEEPER_NAME)
    _write(status_w, rank)
    code = wait_for(rank)
    end_descendants()
    prctl.set_name(then)
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


def end_descendants() -> None:
    """SIGKILL every descendant and reap them, until no child is left (a killed process's
    children are re-parented here, the subreaper: each round finds what the last orphaned)."""
    if not _has_children():
        return  # the usual case: psutil's walk of /proc is not needed
    import psutil  # here: a spawned keeper forks its rank before any import

    while True:
        with contextlib.suppress(psutil.Error):
            for proc in psutil.Process().children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    proc.kill()
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def _has_children() -> bool:
    """Whether any child is left, reaping those that ended."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True


def _write(fd: int, value: int) -> None:
    with contextlib.suppress(OSError):  # the notebook is gone: nobody is waiting
        os.write(fd, STATUS.pack(value))


# -- the forkserver's keepers ------------------------------------------------


def serve_keeper(
    link: socket.socket, forkserver: int, first: list[int] | None, warm: bool
) -> NoReturn:
    """A forkserver's keeper: ``first``, the fds of a rank to start before any order;
    ``warm``, fork an idle worker first. Never returns."""
    try:
        prctl.become_subreaper()
        idle = _fork_idle(link) if warm else None
        fds = first
        while True:
            if fds is None:
                prctl.set_name(IDLE_NAME)
                prctl.die_with(forkserver)
                order, fds = _next_order(link)
                if order == WARM:
                    idle, fds = idle or _fork_idle(link), None
                    continue
                if order != RUN or fds is None:
                    break  # EOF: the forkserver ended this keeper
            prctl.outlive_parent()  # the rank outlives the forkserver, and so does its keeper
            rank = _start_rank(idle, link, fds)
            idle = None
            supervise(rank, fds[3], then=IDLE_NAME)
            fds = None
            try:
                link.sendall(FREE)
            except OSError:
                break  # the forkserver is gone
    except BaseException:
        traceback.print_exc()
        os._exit(1)
    os._exit(0)


def _next_order(link: socket.socket) -> tuple[bytes, list[int] | None]:
    """The next order and its fds (None unless exactly a rank's); ``b""`` at EOF."""
    try:
        msg, fds, _, _ = socket.recv_fds(link, 1, RANK_FDS)
    except OSError:
        return b"", None
    if len(fds) == RANK_FDS:
        return msg, list(fds)
    for fd in fds:
        os.close(fd)
    return msg, None


def _start_rank(idle: tuple[int, socket.socket] | None, link: socket.socket, fds: list[int]) -> int:
    """Start the rank on ``fds``: the idle worker takes ctrl, out and err, or with none
    (or one that died), a rank is forked now. Its pid; ``status_w`` stays open here."""
    ctrl, out, err, status_w = fds
    rank: int | None = None
    if idle is not None:
        pid, idle_link = idle
        try:
            socket.send_fds(idle_link, [RUN], [ctrl, out, err])
            rank = pid
        except OSError:  # it died while idle: fork the rank as on demand
            os.waitpid(pid, 0)
        finally:
            idle_link.close()
    if rank is None:
        rank = os.fork()
        if rank == 0:  # pragma: no cover - runs in the rank
            with in_child():
                # Named at once: its free keeper's name would count it as an idle process.
                prctl.set_name(WORKER_NAME)
                link.close()
                os.close(status_w)
                os.setsid()
            become_rank(ctrl, out, err)
    for fd in (ctrl, out, err):
        os.close(fd)
    return rank


def _fork_idle(link: socket.socket) -> tuple[int, socket.socket]:
    """Fork an idle worker, which waits for a rank's ctrl, out and err fds; (pid, link).
    Named ``WARMING_NAME`` from the fork (the keeper too, for that instant) until it has
    closed what is its keeper's."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    keeper = os.getpid()
    prctl.set_name(WARMING_NAME)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the idle worker
        with in_child():
            link.close()
            ours.close()
            os.setsid()
            prctl.die_with(keeper)
        prctl.set_name(IDLE_NAME)
        try:
            _, fds, _, _ = socket.recv_fds(theirs, 1, 3)
        except OSError:
            fds = []
        if len(fds) != 3:
            os._exit(0)  # its keeper ended it
        theirs.close()
        prctl.outlive_parent()  # from now on a rank: its link to the notebook decides
        become_rank(*fds)
    prctl.set_name(IDLE_NAME)
    theirs.close()
    return pid, ours


@contextlib.contextmanager
def in_child() -> Iterator[None]:
    """The first steps of a forked child: any failure in them ends it."""
    try:
        yield
    except BaseException:
        traceback.print_exc()
        os._exit(1)
