"""Choosing the rendezvous port (``MASTER_PORT``) for a run.

``rendezvous(spec, node)`` is a run's port and store. ``listen`` binds the port and the notebook
hosts the store on it (``host_store``), so it cannot be taken meanwhile; ``choose_port`` returns a
port free a moment ago, for runs where rank 0 binds it itself (``spawn``).
"""

from __future__ import annotations

import errno
import socket

from nbddp.forkserver.server import host_store
from nbddp.launcher.config import JobSpec, NodeSlice
from nbddp.launcher.spelling import OptionError


def choose_port(addr: str, port: int | None, *, fallback: bool) -> tuple[int, str | None]:
    """``port`` if free, else a free one when ``fallback``, with a notice if replaced;
    ``OptionError`` when it is busy without ``fallback``, or ``addr`` cannot be bound."""
    sock, notice = _bound(addr, port, fallback, "bind")
    with sock:
        return int(sock.getsockname()[1]), notice


def listen(addr: str, port: int | None, *, fallback: bool) -> tuple[socket.socket, str | None]:
    """A socket listening on ``addr:port`` (any free port if None), and a notice if the
    requested port was busy and ``fallback`` took another. ``OptionError`` otherwise."""
    return _bound(addr, port, fallback, "listen on", backlog=128)


def _bound(
    addr: str, port: int | None, fallback: bool, what: str, backlog: int | None = None
) -> tuple[socket.socket, str | None]:
    """``addr:port`` bound (listening with ``backlog``), as ``choose_port`` and ``listen``
    say; ``what`` names the attempt in the error."""
    sock = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET, socket.SOCK_STREAM)
    notice = None
    try:
        try:
            sock.bind((addr, port or 0))
        except OSError as exc:
            if port is None or exc.errno not in (errno.EADDRINUSE, errno.EACCES):
                raise
            busy = f"port {port} on {addr} is in use"
            if not fallback:
                raise OptionError(
                    "port",
                    port,
                    lambda s: f"{busy}; {s.unset('port')} to let nbddp pick a free one",
                ) from None
            sock.bind((addr, 0))
            notice = f"{busy}; using port {sock.getsockname()[1]} instead"
        if backlog is not None:
            sock.listen(backlog)
    except BaseException as exc:
        sock.close()
        if isinstance(exc, OSError):
            raise _unusable(addr, what, exc) from exc
        raise
    return sock, notice


def _unusable(addr: str, what: str, exc: OSError) -> OptionError:
    return OptionError(
        "master_addr",
        addr,
        lambda s: (
            f"cannot {what} {s.name('master_addr')} {addr!r} ({exc.strerror}); for a "
            f"run on this machine use {s.given('master_addr', '127.0.0.1')}"
        ),
    )


def rendezvous(spec: JobSpec, node: NodeSlice) -> tuple[int, str | None, object | None]:
    """A run's rendezvous: its port, a notice if the one asked for was busy, and the
    store when this process hosts it."""
    if node.port is not None:
        return node.port, None, None
    if not spec.host_store:
        port, notice = choose_port(spec.master_addr, spec.port, fallback=spec.port_fallback)
        return port, notice, None
    sock, notice = listen(spec.master_addr, spec.port, fallback=spec.port_fallback)
    return int(sock.getsockname()[1]), notice, host_store(spec.master_addr, sock)
