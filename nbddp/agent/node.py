"""The nbddp agent: one per node, running nbddp's own local launcher there.

Contract: an engine places one ``NodeAgent`` per node (``ray_node.RayNodeAgent`` as a Ray actor) and
the notebook calls its methods through a channel, from several threads at once, so ``poll`` may wait
while ``stop`` arrives. ``describe()`` says where it runs and its versions (read without importing
torch); a new agent starts the node's forkserver at once. It holds any number of runs, each under
the notebook's run id with its own ``noderun.NodeRun`` and, on agent 0, its own rendezvous store
(``host_store``/``close_store``). ``poll(wait)`` is the one long poll for all of them: a ``Batch``
per run with its events, new failures and, once its ranks here have all ended, their outcomes
(global ranks), shipped (``portable.ship``). The agent ends itself (exit 1, so every rank's link
closes) once it has lost the notebook: no poll for ``QUIET`` seconds (``_keep_alive``), or its
engine's process on the node gone (``engine_lost``).
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import queue
import socket
import threading
import time
from dataclasses import dataclass, field, replace

from nbddp.agent.noderun import Inbox, NodeRun, Reply
from nbddp.agent.portable import Shipped, ShippedPayload, land_payload, ship
from nbddp.launcher.config import JobSpec, NodeSlice
from nbddp.launcher.events import Done, Failure, RankOutcome, RunEvent, RunStatus
from nbddp.launcher.forkserver_link import FORKSERVER
from nbddp.launcher.ports import listen
from nbddp.wire.descriptors import OwnedFd
from nbddp.wire.protocol import Answer
from nbddp.wire.shm import Mark
from nbddp.wire.versions import local_versions

log = logging.getLogger(__name__)

MAX_BATCH = 5000  # events per poll: a batch stays a bounded message
QUIET = 11.0
"""Seconds without a poll after which the notebook counts as gone (it counts a node
as lost after its poll wait plus ``nodes.LOST_AFTER`` without an answer)."""
FIRST_POLL_WAIT = 180.0  # seconds a new agent waits for its first poll (a slow start)
WATCH_EVERY = 0.5  # seconds between the watchdog's looks


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
    node_id: str = ""
    """Ray's id of the node."""


@dataclass
class Batch:
    """What one poll returns for one run."""

    events: list[RunEvent | Reply] = field(default_factory=list)
    failures: list[tuple[float, Failure]] = field(default_factory=list)
    """Each with ``time.time()`` on the node when it happened."""
    outcomes: list[RankOutcome] | None = None
    """Once the run's ranks on this node have all ended: each one's outcome (its last
    batch)."""
    status: RunStatus | None = None


@dataclass
class _Held:
    """One run this agent holds."""

    job: NodeRun
    kept: dict[Mark, OwnedFd]  # the memory the notebook holds (``portable.land_payload``)
    sent: int = 0  # failures already sent

    def new_failures(self) -> list[tuple[float, Failure]]:
        """The run's failures not sent yet (and from now on counted as sent)."""
        failures = self.job.core.failures()
        # A failure's monotonic time in this process, as time.time().
        wall, first = time.time() - time.monotonic(), self.job.first
        new = [(wall + at, replace(f, rank=f.rank + first)) for at, f in failures[self.sent :]]
        self.sent = len(failures)
        return new


class NodeAgent:
    """One node's agent."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[str, _Held] = {}
        self._stores: dict[str, OwnedFd] = {}
        self._inbox: Inbox = queue.SimpleQueue()
        self._parent = os.getppid()  # the engine's process on the node (Ray's raylet)
        self._keep_alive(FIRST_POLL_WAIT)
        threading.Thread(target=self._watch, name="nbddp-agent-watch", daemon=True).start()
        threading.Thread(target=FORKSERVER.prewarm, name="nbddp-prewarm", daemon=True).start()

    def describe(self) -> NodeInfo:
        """Where this agent runs (the node's forkserver is starting meanwhile)."""
        return NodeInfo(
            address=self.node_address(),
            hostname=socket.gethostname(),
            pid=os.getpid(),
            gpu_ids=self.gpu_ids(),
            versions=local_versions(),
            node_id=self.node_id(),
        )

    # -- what the engine says of this node (overridden by each engine's agent) --------

    def node_address(self) -> str:
        """This node's address in the cluster."""
        return socket.gethostbyname(socket.gethostname())

    def gpu_ids(self) -> tuple[str, ...]:
        """The GPUs the engine gave this agent (``CUDA_VISIBLE_DEVICES`` entries)."""
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        return tuple(t for t in visible.split(",") if t)

    def node_id(self) -> str:
        """The engine's id of this node."""
        return ""

    engine = "the engine's process on this node"  # this agent's parent, named in engine_lost

    def engine_lost(self) -> str | None:
        """Why the engine's process on this node is gone, if it is."""
        return f"{self.engine} is gone" if os.getppid() != self._parent else None

    def host_store(self, run: str, port: int | None) -> int:
        """Host ``run``'s rendezvous store on this node's address, in a child of the node's
        forkserver (torch is imported there, never here); its port."""
        sock, _ = listen(self.node_address(), port, fallback=False)
        bound = int(sock.getsockname()[1])
        store = FORKSERVER.serve_store(sock)
        with self._lock:
            self._stores[run] = store
        return bound

    def start(
        self,
        run: str,
        spec: JobSpec,
        node: NodeSlice,
        payload: ShippedPayload,
        session: bool = False,
    ) -> dict[int, int]:
        """Start this node's ranks of ``run`` (``node``, on the GPUs Ray gave this agent);
        global rank -> pid."""
        if spec.device == "cuda":
            node = replace(node, gpu_tokens=self.gpu_ids())
        kept: dict[Mark, OwnedFd] = {}
        job = NodeRun(spec, land_payload(payload, kept), node, run, self._inbox, session)
        with self._lock:
            self._runs[run] = _Held(job, kept)
        try:
            job.job.start()
        except BaseException:
            with self._lock:
                self._runs.pop(run, None)
            raise
        return {rank + node.first_rank: pid for rank, pid in job.core.pids().items()}

    def poll(self, wait: float) -> Shipped:
        """The long poll: run id -> its batch, shipped."""
        self._keep_alive(QUIET)
        items: list[tuple[str, RunEvent | Reply]] = []
        with contextlib.suppress(queue.Empty):
            items.append(self._inbox.get(timeout=wait))
            while len(items) < MAX_BATCH:
                items.append(self._inbox.get_nowait())
        batches: dict[str, Batch] = {}
        for run, event in items:
            batch = batches.setdefault(run, Batch())
            if isinstance(event, Done):
                self._close(run, batch)
            else:
                batch.events.append(event)
        with self._lock:
            held = list(self._runs.items())
        for run, record in held:
            if new := record.new_failures():
                batches.setdefault(run, Batch()).failures = new
        self._keep_alive(QUIET)
        return ship(batches)

    def _close(self, run: str, batch: Batch) -> None:
        """``run``'s ranks here have all ended: their outcomes go in its last batch."""
        with self._lock:
            record = self._runs.pop(run, None)
        if record is None:
            return
        job = record.job
        batch.failures.extend(record.new_failures())
        batch.outcomes = [replace(o, rank=o.rank + job.first) for o in job.core.outcomes()]
        batch.status = job.core.status

    def stop(self, run: str, reason: RunStatus) -> None:
        """Stop ``run``'s ranks here (SIGTERM to each group, SIGKILL after the grace)."""
        if (job := self._job(run)) is not None:
            job.core.stop(reason)

    def dump_stacks(self, run: str) -> None:
        """Have ``run``'s running ranks here write their stacks into their output."""
        if (job := self._job(run)) is not None:
            job.core.dump_stacks()

    def send(self, run: str, rank: int, kind: str, body: object) -> None:
        """A session's request to its global ``rank`` here (``interrupt``, ``end``...)."""
        if (job := self._job(run)) is not None and job.session:
            job.send(rank, kind, body)

    def send_cell(
        self, run: str, number: int, payload: ShippedPayload, debug: bool = False
    ) -> None:
        """A session's cell ``number`` to each of its ranks here (``debug``: a rank that
        raises opens a debugger first)."""
        if (record := self._held(run)) is not None and record.job.session:
            record.job.send_cell(number, land_payload(payload, record.kept), debug)

    def ask_stacks(self, run: str, ranks: list[int]) -> None:
        """Ask a session's global ``ranks`` here for their stacks."""
        if (job := self._job(run)) is not None and job.session:
            job.ask_stacks(ranks)

    def answer(self, run: str, rank: int, number: int, text: Answer) -> None:
        """The user's line for ``run``'s global ``rank`` here, at its prompt ``number``."""
        if (job := self._job(run)) is not None:
            job.answer(rank, number, text)

    def close_store(self, run: str) -> None:
        """``run`` has ended on every node: its store goes."""
        with self._lock:
            self._stores.pop(run, None)

    def _held(self, run: str) -> _Held | None:
        with self._lock:
            return self._runs.get(run)

    def _job(self, run: str) -> NodeRun | None:
        return record.job if (record := self._held(run)) is not None else None

    # -- the watchdog ----------------------------------------------------------

    def _keep_alive(self, seconds: float) -> None:
        """End this process (exit 1, its threads' stacks in its log) unless called again
        within ``seconds``."""
        # Why faulthandler: its timer is a C thread, so it ends the agent also while a
        # thread holds the GIL (under Ray, a garbage collection blocked in Ray's code
        # once the notebook is gone); a Python watchdog would wait with the rest.
        faulthandler.dump_traceback_later(seconds, exit=True)

    def _watch(self) -> None:
        """End this agent, and so its ranks, once its engine's process is gone."""
        while True:
            time.sleep(WATCH_EVERY)
            if (why := self.engine_lost()) is not None:
                log.warning("nbddp agent: %s; ending this node's ranks and the agent", why)
                # Why _exit: every rank's link closes with this process, and each
                # rank then kills its own process group at once.
                os._exit(1)
