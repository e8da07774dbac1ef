"""The zygote: nbddp's forkserver, a process that has imported torch and forks ranks.

Contract: started by ``starters.ZygoteStarter`` with one end of a Unix
socketpair as ``argv[1]``. For each request (one byte plus four fds: status
write end, ctrl, out, err) it forks a child that runs the worker, writes
the child's pid (8 bytes) to the status fd, and later, when the child has
exited, its exit code (8 bytes), then closes the status fd. It exits when
the notebook's end of the socket closes (the notebook exited, was killed,
or closed it on purpose).

It must stay CUDA-clean: it imports torch but never calls anything that
initialises CUDA, so its children can use the GPUs even when the notebook
itself already has (forking a CUDA-initialised process is what breaks
accelerate's fork-based launcher). It is single-threaded, which is what
makes fork safe here.
"""

from __future__ import annotations

import os
import selectors
import signal
import socket
import sys

from .starters import STATUS, ChildFds, run_forked_worker

PRELOAD = ("torch", "torch.distributed", "cloudpickle", "nbddp.worker", "nbddp.metrics")


def _preload() -> None:
    for name in PRELOAD:
        try:
            __import__(name)
        except Exception as exc:  # a worker will hit and report the same import itself
            print(f"nbddp zygote: could not preload {name}: {exc}", file=sys.stderr)
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():  # pragma: no cover - guard
        print("nbddp zygote: CUDA was initialised during preload", file=sys.stderr)


class Zygote:
    """The fork loop (see module contract)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.children: dict[int, int] = {}  # pid -> status fd
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)

    def serve(self) -> None:
        """Serve requests until the notebook closes its end, then wait for the children.

        Waiting lets running ranks still report their exit codes; if the
        notebook died, they are dying too (each watches its own link)."""
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(self.wake_w)
        sel = selectors.DefaultSelector()
        sel.register(self.sock, selectors.EVENT_READ)
        sel.register(self.wake_r, selectors.EVENT_READ)
        listening = True
        while listening or self.children:
            for key, _ in sel.select():
                if key.fileobj is self.sock:
                    if not self._serve_request():
                        sel.unregister(self.sock)
                        listening = False
                else:
                    os.read(self.wake_r, 4096)
                    self._reap()

    def _serve_request(self) -> bool:
        msg, fds, _, _ = socket.recv_fds(self.sock, 16, 4)
        if not msg:
            return False
        if len(fds) != 4:
            for fd in fds:
                os.close(fd)
            return True
        status_w, ctrl, out, err = fds
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            own = {self.sock.fileno(), self.wake_r, self.wake_w, status_w, *self.children.values()}
            run_forked_worker(ChildFds(ctrl, out, err), own)
        for fd in (ctrl, out, err):
            os.close(fd)
        try:
            os.write(status_w, STATUS.pack(pid))
        except OSError:
            pass  # the requester is gone; the child will find its link closed
        self.children[pid] = status_w
        return True

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            fd = self.children.pop(pid, None)
            if fd is not None:
                try:
                    os.write(fd, STATUS.pack(os.waitstatus_to_exitcode(status)))
                except OSError:
                    pass  # the notebook is gone: nobody is waiting for this status
                finally:
                    os.close(fd)


def main() -> None:
    """Entry point: ``python -c "import nbddp.zygote as z; z.main()" FD``."""
    sock = socket.socket(fileno=int(sys.argv[1]))
    from .worker import set_process_name

    set_process_name("nbddp-zygote")
    _preload()
    Zygote(sock).serve()
