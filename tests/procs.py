"""Finding the nbddp processes this test session started, to prove none is left behind.

A process is nbddp's when it is named ``nbddp-*`` (ranks name themselves
``nbddp-rank<N>``, the forkserver ``nbddp-forksrv``, its pool's idle workers
``nbddp-idle``) or when its environment
at exec time has ``NBDDP_ROLE`` (spawned ranks, and everything forked from
the forkserver: ranks and their DataLoader workers, which rename themselves).
It is this session's when it descends from the test process, or when that
exec-time environment carries ``NBDDP_TEST_SESSION`` (set by
``conftest.py``; kernels started by tests and their forkservers inherit it),
which still holds for orphans. Other sessions on the machine are ignored.
Zombies count as gone: in some containers nothing reaps orphans.

Idle pool workers are expected while their forkserver lives: ``stray_idle``
finds the ones that are not (an orphan, or more than a pool may hold). Each
idle worker is the child of a free keeper, the forkserver's child; both are
named ``nbddp-idle`` (the worker ``nbddp-warming`` until it is ready). A
keeper stays, free, after its rank for the next one: it is a pool member too.

What a process holds is told by identity, not count: ``fd_identities`` names
each open fd by the (device, inode) of what it refers to, which is the same in
every process that holds the same pipe, socket end or file.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections import defaultdict
from collections.abc import Collection

import psutil

MARKER = "NBDDP_TEST_SESSION"
FORKSERVER_NAME = "nbddp-forksrv"
IDLE_NAME = "nbddp-idle"
WARMING_NAME = "nbddp-warming"  # an idle worker still warming up
POOL_CAP = 8  # NBDDP_POOL's default (checked by a unit test): no nbddp import here


def _role(proc: psutil.Process, name: str) -> str:
    if name in (IDLE_NAME, WARMING_NAME):
        return "idle"
    if name == FORKSERVER_NAME:
        # A child the forkserver (or an idle keeper) has just forked still carries
        # its name for an instant (until it names itself nbddp-idle, nbddp-keeper
        # or nbddp-rank<N>).
        with_parent = proc.parent()
        if with_parent is not None and with_parent.name() in (FORKSERVER_NAME, IDLE_NAME):
            return "idle"
        return "forkserver"
    return "worker"


def _descendants() -> set[int]:
    try:
        return {p.pid for p in psutil.Process().children(recursive=True)}
    except psutil.Error:
        return set()


def ours(
    roles: tuple[str, ...] = ("worker",), pids: Collection[int] | None = None
) -> list[psutil.Process]:
    """Live processes of this test session with one of ``roles``.

    ``forkserver``: nbddp's forkserver; ``idle``: its pool's idle workers (and
    a child it forked an instant ago); ``worker``: every other nbddp process
    (ranks and their children). With ``pids``, only those processes (e.g.
    what one kernel started)."""
    session = os.environ[MARKER]
    mine = _descendants()
    found = []
    for proc in psutil.process_iter():
        if pids is not None and proc.pid not in pids:
            continue
        try:
            if proc.pid == os.getpid() or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            name, env = proc.name(), proc.environ()
            if not (name.startswith("nbddp-") or "NBDDP_ROLE" in env):
                continue
            role = _role(proc, name)
            if role in roles and (proc.pid in mine or env.get(MARKER) == session):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


Identity = tuple[int, int]
"""(device, inode) of what an fd refers to: equal in every process that holds it."""


def fd_identities(pid: int) -> dict[int, Identity]:
    """fd -> identity of what it refers to, for every fd ``pid`` has open (Linux)."""
    found = {}
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            info = os.stat(f"/proc/{pid}/fd/{name}")
        except FileNotFoundError:  # closed while listed
            continue
        found[int(name)] = (info.st_dev, info.st_ino)
    return found


def fd_targets() -> list[str]:
    """What each fd this process has open points at (``/proc/self/fd``), sorted: a
    mismatch between two calls names what was opened or left."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            found.append(os.readlink(f"/proc/self/fd/{name}"))
        except FileNotFoundError:  # the listing's own descriptor, closed by now
            continue
    return sorted(found)


def _pipes_and_sockets(pid: int, first: int = 0, sockets: bool = True) -> set[Identity]:
    found = set()
    for fd, ident in fd_identities(pid).items():
        try:
            mode = os.stat(f"/proc/{pid}/fd/{fd}").st_mode
        except FileNotFoundError:
            continue
        if fd >= first and (stat.S_ISFIFO(mode) or (sockets and stat.S_ISSOCK(mode))):
            found.add(ident)
    return found


def rank_and_keeper_pipes() -> list[Identity]:
    """Run in a rank: the pipes and sockets of its run, which nothing may hold once
    it has ended: the rank's (its link, its stdout/stderr pipes) and its keeper's
    exit-status pipe. Not the keeper's stdio (the forkserver's), nor its socket to
    the forkserver, which it keeps from rank to rank."""
    mine = _pipes_and_sockets(os.getpid())
    return sorted(mine | _pipes_and_sockets(os.getppid(), first=3, sockets=False))


def alive(proc: psutil.Process | int) -> bool:
    """Whether ``proc`` (a process or a pid) still runs: a zombie counts as gone."""
    try:
        if isinstance(proc, int):
            proc = psutil.Process(proc)
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def threads_and_fds() -> tuple[int, int]:
    """This process's live threads and open fds: what a run that leaks grows."""
    return threading.active_count(), psutil.Process().num_fds()


def wait_procs_gone(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait until every process in ``procs`` is gone or a zombie; return the survivors.

    psutil.wait_procs alone would wait out the timeout on orphaned zombies
    that nothing reaps, so it is called in short slices between checks.
    """
    deadline = time.monotonic() + timeout
    alive_now = [p for p in procs if alive(p)]
    while alive_now and time.monotonic() < deadline:
        psutil.wait_procs(alive_now, timeout=min(0.1, max(0.0, deadline - time.monotonic())))
        alive_now = [p for p in alive_now if alive(p)]
    return alive_now


def wait_gone(
    roles: tuple[str, ...] = ("worker",),
    timeout: float = 10.0,
    pids: Collection[int] | None = None,
) -> list[psutil.Process]:
    """Wait until no process of this session with ``roles`` is left; return survivors."""
    return wait_procs_gone(ours(roles, pids), timeout)


def _idle_children(pid: int) -> list[psutil.Process]:
    try:
        kids = psutil.Process(pid).children()
    except psutil.NoSuchProcess:
        return []
    found = []
    for proc in kids:
        try:
            if proc.name() == IDLE_NAME and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def idle_of(forkserver: int) -> list[psutil.Process]:
    """The forkserver's idle pool workers now (named ``nbddp-idle``, each the child of
    an idle keeper that is the forkserver's child)."""
    return [w for k in _idle_children(forkserver) for w in _idle_children(k.pid)]


def _pool_of(proc: psutil.Process) -> int | None:
    """The forkserver whose pool ``proc`` (an idle keeper or worker) is in, or None."""
    parent = proc.parent()
    if parent is not None and parent.name() == IDLE_NAME:  # a worker: its keeper's
        parent = parent.parent()
    if parent is not None and parent.name() == FORKSERVER_NAME:
        return parent.pid
    return None


def wait_pool(forkserver: int, size: int, timeout: float = 10.0) -> list[psutil.Process]:
    """Wait until ``forkserver`` has exactly ``size`` idle workers and no other live child
    (a refill is done, or a wind-down); return them. Raises on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            kids = [
                p
                for p in psutil.Process(forkserver).children()
                if p.status() != psutil.STATUS_ZOMBIE
            ]
        except psutil.Error:
            kids = []
        idle = idle_of(forkserver)
        if len(idle) == size and len(kids) == size and all(k.name() == IDLE_NAME for k in kids):
            return idle
        if time.monotonic() > deadline:
            raise AssertionError(
                f"pool of {forkserver}: {len(idle)} idle of {len(kids)}, not {size}"
            )
        psutil.wait_procs(kids, timeout=0.02)  # wakes early when a child exits


def stray_idle(max_per_forkserver: int, timeout: float = 10.0) -> list[psutil.Process]:
    """Idle pool workers of this session that should not exist, after waiting up to
    ``timeout`` for them to go: any whose parent is not a live forkserver (idle workers
    must never outlive theirs), and all of a forkserver's when it keeps more than
    ``max_per_forkserver``."""
    deadline = time.monotonic() + timeout
    while True:
        strays: list[psutil.Process] = []
        pools: dict[int, list[psutil.Process]] = defaultdict(list)
        for proc in ours(("idle",)):
            try:
                pool = _pool_of(proc)
            except psutil.Error:
                pool = None
            if pool is not None:
                pools[pool].append(proc)
            else:
                strays.append(proc)
        # Each pool member is a keeper and its worker: two processes.
        strays += [p for pool in pools.values() if len(pool) > 2 * max_per_forkserver for p in pool]
        if not strays or time.monotonic() > deadline:
            return strays
        wait_procs_gone(strays, timeout=0.1)
