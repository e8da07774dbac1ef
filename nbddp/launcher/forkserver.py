"""nbddp's forkserver: a process that has imported torch (never CUDA) and forks ranks.

Contract: started by ``starters.ForkserverStarter`` with one end of a Unix
socketpair as ``argv[1]``. For each request (``starters.REQUEST`` plus four
fds: status write end, ctrl, out, err) it finds a keeper for the rank
(a free one, warm first, or else a child forked now) and hands it the
four fds; the keeper (``nbddp.rank.pooled``), the rank's parent, writes the
rank's pid (8 bytes) to the status fd, and later, once the rank and all
its descendants are gone, its exit code (8 bytes). Requests are answered in
the order they come, without waiting for a keeper's fork: a launch sends all
its requests at once, and its ranks' keepers fork them side by side. The forkserver keeps no
status fd: ranks outlive it, and their exit codes still reach the notebook.
It is a child subreaper, so that it reaps what a killed keeper leaves. It exits when
the notebook's end of the socket closes (the notebook exited, was killed,
or closed it on purpose), after ending its idle workers and waiting for
its ranks.

The pool (``nbddp.launcher.pool``): each request says how many idle workers
to keep (the launch's size, capped) and for how long without a launch; a
keeper whose rank has ended stays, free, for the next rank while fewer than
that are free. The forkserver refills the pool when ``pool.refill_wait`` says
(during a run where a core is spare, else once no rank of its own has run for
a moment), one keeper at a time with requests served first, and ends the
free keepers when that time passes.

Before its first refill, and waiting as a refill does, it moves the memory
its preload wrote into huge pages, one at a time (``nbddp.launcher.hugepages``):
each fork of it, and each exit of what it forked, then has hundreds of
page-table entries to copy and tear down where it had tens of thousands.
Keepers forked before it was done (for a launch that came during the
preload) are replaced once it is (``Pool.renew``).

It must stay CUDA-clean: it imports torch but never calls anything that
initialises CUDA, so its children can use the GPUs even when the notebook
itself already has (forking a CUDA-initialised process is what breaks
accelerate's fork-based launcher). It is single-threaded, which is what
makes fork safe here.
"""

from __future__ import annotations

import gc
import os
import select
import selectors
import signal
import socket
import sys
import time

from nbddp.launcher.hugepages import Collapser, plan
from nbddp.launcher.pool import Pool, cpu_stall_us, refill_wait, stall_limit
from nbddp.launcher.starters import REQUEST
from nbddp.rank.keeper import become_subreaper

PRELOAD = (
    "torch",
    "torch.distributed",
    "cloudpickle",
    "psutil",  # the keeper's
    "nbddp.rank.worker",  # with the rank's channel and context, and the wire it loads and sends
    "nbddp.rank.metrics",  # nbddp.log
    "nbddp.rank.calls",  # spawn()'s wrapper
    "nbddp.notebook.cell",  # what a %%ddp cell's ranks unpickle
)
"""What every rank imports: imported once here, so that forked ranks start with it."""


def _preload() -> None:
    for name in PRELOAD:
        try:
            __import__(name)
        except Exception as exc:  # a worker will hit and report the same import itself
            print(f"nbddp forkserver: could not preload {name}: {exc}", file=sys.stderr)
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():  # pragma: no cover - guard
        print("nbddp forkserver: CUDA was initialised during preload", file=sys.stderr)


class Forkserver:
    """The fork loop (see module contract)."""

    def __init__(self, sock: socket.socket, collapse: Collapser | None = None) -> None:
        self.sock = sock
        self.collapse = collapse  # what is left to move into huge pages (hugepages)
        self.selector = selectors.DefaultSelector()
        self.pool = Pool(self.selector)
        self.cores = _cores()
        self.stall_limit = stall_limit(os.environ)
        self.stall_at_request = cpu_stall_us()  # the CPU's stall total at the last request
        self.listening = True
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)

    def serve(self) -> None:
        """Serve requests until the notebook closes its end, then wait for the children.

        Waiting lets running ranks still report their exit codes; if the
        notebook died, they are dying too (each watches its own link)."""
        become_subreaper()
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(self.wake_w)
        sel = self.selector
        sel.register(self.sock, selectors.EVENT_READ)
        sel.register(self.wake_r, selectors.EVENT_READ)
        while self.listening or self.pool.busy or self.pool.ending:
            for key, _ in sel.select(self._timeout()):
                if key.data is not None:  # a keeper's link: its pid
                    self.pool.heard(key.data, self.listening)
                elif key.fileobj is self.sock:
                    if not self._serve_request():
                        sel.unregister(self.sock)
                        self.listening = False
                        self.pool.wind_down()
                else:
                    os.read(self.wake_r, 4096)
                    self._reap()
            self._tend_pool()

    def _refill_in(self) -> float | None:
        """Seconds until a refill is due (0: now); None while none will be (the
        policy and its reasons: ``pool.refill_wait``)."""
        return self._spare_in(self.pool.short())

    def _collapse_in(self) -> float | None:
        """Seconds until the next huge page of the collapse is due (0: now); None when
        it is done. It costs CPU as a refill does, so it waits as one would, and it
        comes before any refill: the pool's keepers then start from the collapsed
        memory. Keepers forked before it was done are replaced after it (``_tend_pool``)."""
        return None if self.collapse is None else self._spare_in(True)

    def _spare_in(self, wanted: bool) -> float | None:
        """Seconds until background work (``wanted``) may take the CPU; see ``refill_wait``."""
        if not self.listening:
            return None
        now = time.monotonic()
        return refill_wait(
            short=wanted,
            running=len(self.pool.busy),
            cores=self.cores,
            since_request=now - self.pool.last_request,
            since_active=now - self.pool.last_used,
            stalled=self._stalled(now - self.pool.last_request),
            stall_limit=self.stall_limit,
        )

    def _stalled(self, since: float) -> float:
        """The share of the last ``since`` seconds in which some task waited for CPU."""
        before, after = self.stall_at_request, cpu_stall_us()
        if before is None or after is None or since <= 0.0:
            return 0.0
        return (after - before) / (since * 1e6)

    def _timeout(self) -> float | None:
        due = (self._collapse_in(), self._refill_in(), self.pool.wind_down_in())
        waits = [t for t in due if t is not None]
        return min(waits, default=None)

    def _tend_pool(self) -> None:
        """Collapse one huge page, or else warm one keeper (a request that arrives
        meanwhile goes first, since the loop polls before each), or wind the pool
        down when idle."""
        if self.pool.wind_down_in() == 0.0:
            self.pool.wind_down()
        elif _readable(self.sock):
            return
        elif self.collapse is not None and self._collapse_in() == 0.0:
            if not self.collapse.step():
                if self.collapse.collapsed:
                    # Keepers forked before now kept the pages as they were, not
                    # shared with this process any more: memory for nothing, and no
                    # cheaper forks. A launch that came during the preload forked them.
                    self.pool.renew()
                self.collapse = None
        elif self._refill_in() == 0.0:
            try:
                self.pool.warm_one(self._fds())
            except OSError as exc:  # out of processes or fds: serve requests by fork alone
                print(f"nbddp forkserver: could not refill the pool: {exc}", file=sys.stderr)
                self.pool.size = self.pool.warm()

    def _fds(self) -> set[int]:
        """Every fd the forkserver holds: a forked child must close them all."""
        own = {self.sock.fileno(), self.wake_r, self.wake_w}
        selector_fd = getattr(self.selector, "fileno", None)  # epoll and kqueue hold one
        if selector_fd is not None:
            own.add(selector_fd())
        return own

    def _serve_request(self) -> bool:
        msg, fds, _, _ = socket.recv_fds(self.sock, REQUEST.size, 4)
        if not msg:
            return False
        if len(fds) != 4 or len(msg) != REQUEST.size:
            for fd in fds:
                os.close(fd)
            return True
        _, size, idle_timeout = REQUEST.unpack(msg)
        self.pool.resize(size, idle_timeout)
        self.stall_at_request = cpu_stall_us()
        status_w, ctrl, out, err = fds
        rank_fds = (ctrl, out, err, status_w)
        if self.pool.hand_over(rank_fds) is None:
            self._hear_keepers()
            if self.pool.hand_over(rank_fds) is None:
                self.pool.start_keeper(self._fds(), rank_fds)
        for fd in fds:
            os.close(fd)
        return True

    def _hear_keepers(self) -> None:
        """Take in what keepers have said and not yet been heard: a keeper says it is
        free only after reporting its rank's exit code, so the notebook's next
        launch can come first, and it should find that keeper free, not fork another."""
        for key, _ in self.selector.select(0):
            if key.data is not None:
                self.pool.heard(key.data, self.listening)

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            del status  # the keeper reported its rank's exit code itself
            self.pool.forget(pid)  # False: an orphan a killed keeper left, re-parented here


def _cores() -> int:
    """The cores this process may run on (its affinity, where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _readable(sock: socket.socket) -> bool:
    ready, _, _ = select.select([sock], [], [], 0)
    return bool(ready)


def main() -> None:
    """Entry point: ``python -c "import nbddp.launcher.forkserver as z; z.main()" FD
    [SIZE IDLE]``: with SIZE and IDLE, the pool to fill before the first request
    says (``config.first_pool``), so that the first launch finds it full too."""
    sock = socket.socket(fileno=int(sys.argv[1]))
    from nbddp.rank.worker import set_process_name

    set_process_name("nbddp-forksrv")
    _preload()
    # Why freeze: every object the preload made (torch's, hundreds of thousands)
    # is shared copy-on-write with each forked rank. A collection in a rank would
    # walk them all, writing their GC headers, and so copy most of those pages:
    # milliseconds of page faults at a random point of the rank's start. Frozen
    # objects are never walked (the pre-fork server pattern gc.freeze exists for).
    gc.freeze()
    server = Forkserver(sock, plan(os.environ))
    if len(sys.argv) > 3:
        server.pool.resize(int(sys.argv[2]), float(sys.argv[3]))
    server.serve()
