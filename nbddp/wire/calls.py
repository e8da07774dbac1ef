"""Calls to an object in another process over one TCP connection, both ends.

Contract: the caller's side is a ``Caller``: ``call(method, *args)`` sends ``(method, (id, args))``
and returns a ``concurrent.futures.Future`` that gets the value, or the exception the callee raised;
calls from many threads share the connection and may be answered in any order. ``close()``, or the
connection ending, fails every call not yet answered with ``ConnectionError``. The callee's side is
``serve(sock, target)``: each call runs on a thread of its own pool (a long poll never holds up a
stop) and its answer is ``("ok" | "err", (id, value))``. Messages are pickles, so a connection is
read only once it has proved a secret, sent as plain bytes before anything else (``prove``,
``proven``).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hmac
import itertools
import logging
import socket
import threading
from collections.abc import Callable

from nbddp.wire import protocol

log = logging.getLogger(__name__)

SERVE_THREADS = 32  # calls a callee runs at once


class Caller:
    """The calling side of a connection."""

    def __init__(self, sock: socket.socket, name: str) -> None:
        self.sock, self.name = sock, name
        self.closed = False
        self.gone: Callable[[], str] = lambda: f"the agent on {self.name} is gone"
        """Why the connection ended, when it ends by itself (the callee's side knows best)."""
        self._lock = threading.Lock()
        self._waiting: dict[int, concurrent.futures.Future[object]] = {}
        self._ids = itertools.count()
        threading.Thread(target=self._read, name=f"nbddp-calls-{name}", daemon=True).start()

    def call(self, method: str, *args: object) -> concurrent.futures.Future[object]:
        future: concurrent.futures.Future[object] = concurrent.futures.Future()
        with self._lock:
            if self.closed:
                raise ConnectionError(f"the agent on {self.name} is gone")
            number = next(self._ids)
            self._waiting[number] = future
            try:
                protocol.send(self.sock, method, (number, args))
            except OSError as exc:
                self._waiting.pop(number, None)
                raise ConnectionError(f"the agent on {self.name} is gone ({exc})") from None
        return future

    def _read(self) -> None:
        try:
            while (message := protocol.recv(self.sock)) is not None:
                kind, (number, value) = message
                with self._lock:
                    future = self._waiting.pop(number, None)
                if future is None:
                    continue
                if kind == "ok":
                    future.set_result(value)
                else:
                    future.set_exception(value)
        except (OSError, EOFError) as exc:
            log.debug("nbddp: connection to %s ended: %s", self.name, exc)
        self.close(self.gone())
        self.sock.close()  # here, once nothing reads it any more

    def close(self, why: str) -> None:
        """End the connection (its reader then closes the socket); every call not yet
        answered fails, saying ``why``."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            waiting, self._waiting = self._waiting, {}
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        for future in waiting.values():
            future.set_exception(ConnectionError(why))


def serve(sock: socket.socket, target: object) -> None:
    """Answer calls on ``sock`` with ``target``'s methods until the caller closes it."""
    lock = threading.Lock()
    pool = concurrent.futures.ThreadPoolExecutor(SERVE_THREADS, "nbddp-serve")

    def answer(method: str, number: int, args: tuple[object, ...]) -> None:
        try:
            reply: tuple[str, object] = ("ok", getattr(target, method)(*args))
        except Exception as exc:  # the caller raises it
            reply = ("err", exc)
        with lock:
            try:
                protocol.send(sock, reply[0], (number, reply[1]))
            except OSError:
                pass  # the caller is gone: the loop below ends
            except Exception as exc:  # an unpicklable value or exception
                protocol.send(sock, "err", (number, RuntimeError(repr(exc))))

    try:
        while (message := protocol.recv(sock)) is not None:
            method, (number, args) = message
            pool.submit(answer, method, number, args)
    except OSError as exc:
        log.debug("nbddp: the caller's connection ended: %s", exc)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def prove(sock: socket.socket, secret: str, about: object) -> None:
    """Send the secret, as plain bytes before anything pickled, then ``about`` (what
    the callee says of itself)."""
    sock.sendall(secret.encode())
    protocol.send(sock, "hello", about)


def proven(sock: socket.socket, secret: str) -> object | None:
    """What a new connection says of itself once it proved ``secret``; None, with
    nothing unpickled, when it did not."""
    want = secret.encode()
    given = protocol.recv_exact(sock, len(want))
    if given is None or not hmac.compare_digest(given, want):
        return None
    message = protocol.recv(sock)
    return message[1] if message is not None and message[0] == "hello" else None
