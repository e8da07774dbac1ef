"""nbddp's forkserver: a single-threaded process that imported torch (never CUDA) and forks ranks.

Started by the notebook (``launcher.forkserver_link``) with ``main()``: argv ``FD [SIZE IDLE]``,
``FD`` one end of a Unix socketpair. Each ``REQUEST`` comes with four fds (status_w, ctrl, out,
err), handed to a free keeper of its pool or to a newly forked one (``pool``), without waiting.
It keeps no status fd, so ranks outlive it; it is a child subreaper, and exits when the notebook
closes its end, after ending its free keepers and waiting for its ranks. It must never
initialise CUDA, so that its children can use the GPUs even when the notebook has.
"""

from __future__ import annotations

import gc
import logging
import os
import select
import selectors
import signal
import socket
import struct
import sys
from datetime import timedelta

from nbddp import prctl
from nbddp.forkserver import keeper
from nbddp.forkserver.pool import Pool

log = logging.getLogger(__name__)

REQUEST = struct.Struct("!cqd")
"""A request: its kind (``b"F"``: a rank, with four fds; ``b"S"``: a rendezvous store, with
its listening socket and a pipe's end, ``serve_store``), then the pool to keep afterwards:
how many idle workers, and after how many idle seconds they end."""
NAME = "nbddp-forksrv"

PRELOAD = (
    "torch",
    "torch.distributed",
    "cloudpickle",
    "psutil",  # the keeper's
    "nbddp.rank.worker",  # its channel, context (spawn()'s wrapper), the wire it loads and sends
    "nbddp.rank.metrics",  # nbddp.log
    "nbddp.rank.cell",  # what a %%ddp cell's ranks unpickle
)
"""What every rank imports: imported once here, so that forked ranks start with it."""


def _preload() -> None:
    for name in PRELOAD:
        try:
            __import__(name)
        except Exception as exc:  # a rank will hit and report the same import itself
            log.warning("nbddp's forkserver could not preload %s: %s", name, exc)
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():  # pragma: no cover - guard
        log.error("nbddp's forkserver initialised CUDA while preloading")


class Forkserver:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.selector = selectors.DefaultSelector()
        self.pool = Pool(self.selector)
        self.listening = True
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)

    def serve_requests(self) -> None:
        """Serve requests until the notebook closes its end, then wait for the children
        (running ranks still report their exit codes; if the notebook died, they are
        dying too: each watches its own link)."""
        prctl.become_subreaper()
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

    def _timeout(self) -> float | None:
        due = (self.pool.refill_in() if self.listening else None, self.pool.wind_down_in())
        return min((t for t in due if t is not None), default=None)

    def _tend_pool(self) -> None:
        """Wind the pool down when idle, or else warm one keeper when due (a request
        that arrives meanwhile goes first: the loop polls before each)."""
        if self.pool.wind_down_in() == 0.0:
            self.pool.wind_down()
        elif self.listening and self.pool.refill_in() == 0.0 and not _readable(self.sock):
            try:
                self.pool.warm_one(self._fds())
            except OSError as exc:  # out of processes or fds: serve requests by fork alone
                log.warning("nbddp's forkserver could not refill its pool: %s", exc)
                self.pool.size = self.pool.warm()

    def _fds(self) -> set[int]:
        """Every fd the forkserver holds: a forked child must close them all."""
        own = {self.sock.fileno(), self.wake_r, self.wake_w}
        selector_fd = getattr(self.selector, "fileno", None)  # epoll holds one
        if selector_fd is not None:
            own.add(selector_fd())
        return own

    def _serve_request(self) -> bool:
        msg, fds, _, _ = socket.recv_fds(self.sock, REQUEST.size, 4)
        if not msg:
            return False
        kind, size, idle = REQUEST.unpack(msg) if len(msg) == REQUEST.size else (b"", 0, 0.0)
        if kind == b"S" and len(fds) == 2:
            serve_store(self._fds(), *fds)
        elif kind == b"F" and len(fds) == 4:
            self.pool.resize(size, idle)
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
        free only after reporting its rank's exit code, so the notebook's next launch
        can come first, and should find that keeper free rather than fork another."""
        for key, _ in self.selector.select(0):
            if key.data is not None:
                self.pool.heard(key.data, self.listening)

    def _reap(self) -> None:
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.pool.forget(pid)  # a keeper reports its rank's exit code itself


STORE_TIMEOUT = 1800.0  # the store's own timeout for a rank's request, as torch's default


def host_store(address: str, sock: socket.socket) -> object:
    """A rendezvous ``TCPStore`` served on ``sock``, which it takes over: dropping it
    shuts the server down."""
    import torch.distributed as dist  # not CUDA: safe in the notebook and the forkserver

    return dist.TCPStore(  # type: ignore[attr-defined]  # exported at runtime
        address,
        int(sock.getsockname()[1]),
        None,
        True,
        timedelta(seconds=STORE_TIMEOUT),
        wait_for_workers=False,
        master_listen_fd=sock.detach(),
    )


def serve_store(close: set[int], listen_fd: int, end: int) -> None:
    """Fork a child that serves a rendezvous store on the socket ``listen_fd`` until the
    pipe ``end`` reads end of file (its writer, the agent asking, closed it or died)."""
    if os.fork() == 0:  # pragma: no cover - runs in the store's process
        with keeper.in_child():
            keeper.detach(close)
            prctl.set_name("nbddp-store")
            sock = socket.socket(fileno=listen_fd)
            _store = host_store(sock.getsockname()[0], sock)
        while os.read(end, 1):
            pass
        os._exit(0)


def _readable(sock: socket.socket) -> bool:
    ready, _, _ = select.select([sock], [], [], 0)
    return bool(ready)


def main() -> None:
    """The forkserver's process: with SIZE and IDLE, the pool to fill before the first
    request says, so that the first launch finds it full too."""
    sock = socket.socket(fileno=int(sys.argv[1]))
    prctl.set_name(NAME)
    _preload()
    # Why freeze: every object the preload made (torch's, hundreds of thousands) is
    # shared copy-on-write with each forked rank; a collection in a rank would walk
    # them all, writing their GC headers, and so copy most of those pages. Frozen
    # objects are never walked (the pre-fork server pattern gc.freeze exists for).
    gc.freeze()
    server = Forkserver(sock)
    if len(sys.argv) > 3:
        server.pool.resize(int(sys.argv[2]), float(sys.argv[3]))
    server.serve_requests()
