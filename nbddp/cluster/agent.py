"""The nbddp agent: one Ray actor per node, running nbddp's own local launcher there.

Contract: the notebook (``client``) creates one ``NodeAgent`` per node, in a
placement group, and drives it with actor calls; Ray runs the methods on
threads of the actor (it is created with ``max_concurrency``), so ``poll``
may wait while ``stop`` arrives. ``describe()`` says where it runs and its
versions, and starts the node's forkserver (a fresh process, never a fork of
this multithreaded Ray worker) so its torch import overlaps the rest of the
start. Agent 0 hosts the rendezvous store (``host_store``), bound on its node
address before any rank starts. ``start`` runs the node's slice of the run as
a local ``Job`` (global ranks ``node.first_rank`` on). ``poll(wait)`` is the
long poll: it returns at once when events are queued, else after at most
``wait`` seconds, a ``Batch`` of the events with global ranks, the new
failures, and once the node's ranks are all gone, their outcomes and the
node's status. ``stop``/``dump_stacks`` go to the node's job.

Lifetime: ranks are this agent's local job's children; each rank watches its
link to the agent and ends its process group when the agent goes (killed by
Ray when the notebook's driver or the node goes). Values, exceptions and the
call's arguments cross as plain bytes (``portable``), landing in shared
memory on the other side.
"""

from __future__ import annotations

import os
import queue
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from nbddp.cluster.portable import (
    ShippedFailure,
    ShippedOutcome,
    land_payload,
    ship_failure,
    ship_outcome,
)
from nbddp.cluster.versions import local_versions
from nbddp.launcher.config import JobSpec, NodeSlice
from nbddp.launcher.events import (
    Done,
    InputAsked,
    MetricRows,
    RunEvent,
    RunStatus,
    StateChanged,
    Text,
)
from nbddp.launcher.job import Job
from nbddp.launcher.ports import host_store, listen

MAX_BATCH = 5000  # events per poll: a batch stays a bounded message


@dataclass(frozen=True)
class NodeInfo:
    """Where an agent runs and what it has."""

    address: str
    """The node's address in the cluster (Ray's node IP)."""
    hostname: str
    pid: int
    gpu_ids: tuple[str, ...]
    """The GPUs Ray gave the agent (``CUDA_VISIBLE_DEVICES`` ids)."""
    versions: dict[str, str]


@dataclass
class Batch:
    """What one poll returns (see module contract)."""

    events: list[RunEvent] = field(default_factory=list)
    failures: list[ShippedFailure] = field(default_factory=list)
    outcomes: list[ShippedOutcome] | None = None
    """Once the node's ranks have all ended: each one's outcome (the last batch)."""
    status: RunStatus | None = None


class NodeAgent:
    """One node's agent (see module contract)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._job: Job | None = None
        self._first = 0
        self._sent = 0  # failures already sent
        self._store: object | None = None

    def describe(self) -> NodeInfo:
        """Where this agent runs; starts the node's forkserver in the background."""
        import ray

        from nbddp.launcher.forkserver_link import FORKSERVER

        threading.Thread(target=FORKSERVER.prewarm, name="nbddp-prewarm", daemon=True).start()
        return NodeInfo(
            address=_node_address(),
            hostname=socket.gethostname(),
            pid=os.getpid(),
            gpu_ids=tuple(str(g) for g in ray.get_gpu_ids()),
            versions=local_versions(),
        )

    def host_store(self, port: int | None) -> int:
        """Host the run's rendezvous store on this node's address; its port."""
        sock, _ = listen(_node_address(), port, fallback=False)
        bound = int(sock.getsockname()[1])
        with self._lock:
            # Replacing the last run's store closes its socket.
            self._store = host_store(sock.getsockname()[0], sock)
        return bound

    def start(
        self, spec: JobSpec, node: NodeSlice, payload: tuple[bytes, tuple[bytes, ...]]
    ) -> dict[int, int]:
        """Start this node's ranks (``node``, on the GPUs Ray gave this agent); global
        rank -> pid."""
        import ray

        if spec.device == "cuda":
            node = replace(node, gpu_tokens=tuple(str(g) for g in ray.get_gpu_ids()))
        job = Job(spec, land_payload(payload), node)
        with self._lock:
            self._job, self._first, self._sent = job, node.first_rank, 0
        job.start()
        return {rank + node.first_rank: pid for rank, pid in job.pids().items()}

    def poll(self, wait: float) -> Batch:
        """The long poll (see module contract)."""
        job, first = self._job, self._first
        batch = Batch()
        if job is None:
            return batch
        done = False
        try:
            event: RunEvent | None = job.events.get(timeout=wait)
            while event is not None and len(batch.events) < MAX_BATCH:
                if isinstance(event, Done):
                    done = True
                    break
                batch.events.append(_global(event, first))
                event = job.events.get_nowait()
        except queue.Empty:
            pass
        failures = job.failures()
        batch.failures = [ship_failure(_wall(at), f, first) for at, f in failures[self._sent :]]
        self._sent = len(failures)
        if done:
            batch.outcomes = [ship_outcome(o, first) for o in job.outcomes()]
            batch.status = job.status
            with self._lock:
                self._job = None
        return batch

    def stop(self, reason: RunStatus) -> None:
        """Stop this node's ranks (SIGTERM to each group, SIGKILL after the grace)."""
        job = self._job
        if job is not None:
            job.stop(reason)

    def dump_stacks(self) -> None:
        """Have this node's running ranks write their stacks into their output."""
        job = self._job
        if job is not None:
            job.dump_stacks()

    def answer(self, rank: int, number: int, text: str | None) -> None:
        """The user's line for this node's ``rank`` (local) at its prompt."""
        job = self._job
        if job is not None:
            job.answer(rank, number, text)

    def close_store(self) -> None:
        """The run has ended on every node: its store goes."""
        with self._lock:
            self._store = None


def _node_address() -> str:
    """This node's address in the cluster, as Ray knows it."""
    from ray.util import get_node_ip_address

    address: Callable[[], str] = get_node_ip_address
    return address()


def _global(event: RunEvent, first: int) -> RunEvent:
    """``event`` with its rank made global."""
    if isinstance(event, Text | StateChanged | MetricRows | InputAsked):
        return replace(event, rank=event.rank + first)
    return event


def _wall(monotonic: float) -> float:
    """A ``time.monotonic()`` of this process as ``time.time()``."""
    return time.time() - (time.monotonic() - monotonic)
