"""Freeing a session's ranks from a collective, and giving them a new process group.

With gloo, ``shut_accepted()`` on every rank (its link thread) and ``close_group()`` on the idle
ranks close the connections their blocked peers wait on, so those collectives raise and the peers
return to idle; ``regroup(n)`` on every rank then gives each a new default group (same backend,
rank, world size) that meets under ``nbddp/regroup/<n>/`` in the run's store. Objects bound to the
old group are broken afterwards; other backends are not freed this way (the session ends).
"""

from __future__ import annotations

import importlib
import itertools
import logging
import os
import socket
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

log = logging.getLogger(__name__)

REGROUP_TIMEOUT = 30.0  # seconds every rank gets to join the new group


def close_group() -> None:
    """Destroy this rank's default process group, if it has one."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def shut_accepted() -> None:
    """Shut every TCP connection this process accepted on a listening socket of its own: a
    gloo group's connections to the other ranks (each pair has one accepting end). An object
    alive that holds the group (a DDP model) keeps them open past ``close_group``; shut, the
    peers blocked on them raise."""
    import psutil

    me = psutil.Process()
    conns = (getattr(me, "net_connections", None) or me.connections)("tcp")  # before psutil 6
    listening = {c.laddr.port for c in conns if c.status == psutil.CONN_LISTEN}
    for conn in conns:
        if conn.status == psutil.CONN_ESTABLISHED and conn.laddr.port in listening:
            try:
                with socket.socket(fileno=os.dup(conn.fd)) as sock:
                    sock.shutdown(socket.SHUT_RDWR)
            except OSError:  # closed since it was listed
                log.debug("nbddp: connection on fd %d was already gone", conn.fd)


def regroup(number: int, backend: str, rank: int, world_size: int) -> None:
    """Give this rank a new default process group; returns once every rank has it."""
    import torch.distributed as dist

    close_group()
    timeout = timedelta(seconds=REGROUP_TIMEOUT)
    store = dist.TCPStore(  # type: ignore[attr-defined]  # exported at runtime
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), None, False, timeout
    )
    prefix = dist.PrefixStore(f"nbddp/regroup/{number}/", store)  # type: ignore[attr-defined]
    dist.init_process_group(
        backend=backend, store=prefix, rank=rank, world_size=world_size, timeout=timeout
    )
    all_arrive(prefix, "joined", world_size)  # as at the start: every rank's group is complete


def all_arrive(store: Any, name: str, world_size: int, timeout: float | None = None) -> None:
    """Count this rank in at ``nbddp/{name}`` of ``store``; return once all ``world_size``
    have, or after ``timeout`` seconds whether they have or not."""
    if store.add(f"nbddp/{name}", 1) >= world_size:
        store.set(f"nbddp/all_{name}", b"1")
    elif timeout is None:
        store.wait([f"nbddp/all_{name}"])
    else:
        # Polled, not a ``wait`` with a timeout: one that times out (a peer at a prompt,
        # say) has torch write two warnings into the rank's output.
        until = time.monotonic() + timeout
        while not store.check([f"nbddp/all_{name}"]) and time.monotonic() < until:
            time.sleep(0.01)


def fresh_rendezvous() -> None:
    """Prefix each later ``env://`` rendezvous of this process (``nbddp/init/<n>/``)."""
    import torch.distributed as dist

    # ``import torch.distributed.rendezvous`` names the function of that name.
    rendezvous = importlib.import_module("torch.distributed.rendezvous")
    handlers = getattr(rendezvous, "_rendezvous_handlers", None)
    original = handlers.get("env") if isinstance(handlers, dict) else None
    if handlers is None or original is None:
        # Another torch: a re-initialised group may then meet stale keys.
        log.warning("nbddp: torch's env:// rendezvous handler was not found; left as is")
        return
    count = itertools.count(1)

    def env_handler(url: str, **kwargs: object) -> Iterator[tuple[object, int, int]]:
        prefix = f"nbddp/init/{next(count)}/"
        for store, rank, world_size in original(url, **kwargs):
            yield dist.PrefixStore(prefix, store), rank, world_size  # type: ignore[attr-defined]

    # torch's register_rendezvous_handler refuses a scheme it has; this
    # handler wraps the one it replaces and keeps its signature.
    handlers["env"] = env_handler
