"""Choosing the rendezvous port (``MASTER_PORT``) for a run.

Contract: ``choose_port`` returns a port that was free on ``master_addr``
a moment ago. Between that check and rank 0 binding it another program
could take it; the window is a few milliseconds, the same as torchrun's.
"""

from __future__ import annotations

import errno
import socket

from .errors import ConfigError


def _family(addr: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in addr else socket.AF_INET


def port_is_free(addr: str, port: int) -> bool:
    """True when a TCP listener could bind ``addr:port`` now."""
    with socket.socket(_family(addr), socket.SOCK_STREAM) as sock:
        try:
            sock.bind((addr, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def free_port(addr: str) -> int:
    """A port the OS reports free on ``addr``."""
    with socket.socket(_family(addr), socket.SOCK_STREAM) as sock:
        sock.bind((addr, 0))
        return int(sock.getsockname()[1])


def choose_port(addr: str, port: int | None, *, fallback: bool) -> tuple[int, str | None]:
    """Pick ``MASTER_PORT``: ``port`` if free, else a free one when ``fallback``.

    Returns the port and a notice for the user when the requested port was
    replaced (``None`` otherwise). Raises ``ConfigError`` when ``port`` is
    busy and ``fallback`` is false, or ``addr`` cannot be bound at all.
    """
    try:
        if port is None:
            return free_port(addr), None
        if port_is_free(addr, port):
            return port, None
        if not fallback:
            raise ConfigError(
                f"port {port} on {addr} is in use; pass port=None to let nbddp pick a free one"
            )
        chosen = free_port(addr)
    except OSError as exc:
        raise ConfigError(
            f"cannot bind master_addr {addr!r} ({exc.strerror}); for a run on this machine "
            "use master_addr='127.0.0.1'"
        ) from exc
    return chosen, f"port {port} on {addr} is in use; using port {chosen} instead"
