"""Port choice: a given busy port raises, or is replaced with a notice in fallback mode."""

from __future__ import annotations

import errno
import socket

import pytest

from nbddp.errors import ConfigError
from nbddp.launcher.ports import choose_port, listen


def port_is_free(addr: str, port: int) -> bool:
    """True when a TCP listener could bind ``addr:port`` now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((addr, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def test_auto_port_is_free() -> None:
    port, notice = choose_port("127.0.0.1", None, fallback=False)
    assert notice is None
    assert port_is_free("127.0.0.1", port)


def test_busy_port_raises_or_falls_back_with_a_notice() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        busy = sock.getsockname()[1]
        with pytest.raises(ConfigError, match=f"port {busy} on 127.0.0.1 is in use; use port=None"):
            choose_port("127.0.0.1", busy, fallback=False)
        port, notice = choose_port("127.0.0.1", busy, fallback=True)
    assert port != busy
    assert notice == f"port {busy} on 127.0.0.1 is in use; using port {port} instead"


def test_unbindable_address_says_what_to_use() -> None:
    with pytest.raises(ConfigError, match=r"master_addr='127\.0\.0\.1'"):
        choose_port("203.0.113.7", None, fallback=False)


def test_listen_holds_the_port_and_falls_back_or_raises_when_busy() -> None:
    sock, notice = listen("127.0.0.1", None, fallback=False)
    with sock:
        busy = sock.getsockname()[1]
        assert notice is None and not port_is_free("127.0.0.1", busy)
        with pytest.raises(ConfigError, match=f"port {busy} on 127.0.0.1 is in use"):
            listen("127.0.0.1", busy, fallback=False)
        other, notice = listen("127.0.0.1", busy, fallback=True)
        with other:
            assert notice == (
                f"port {busy} on 127.0.0.1 is in use; using port {other.getsockname()[1]} instead"
            )
