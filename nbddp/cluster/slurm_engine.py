"""The Slurm engine: agents as a job step of the allocation this notebook runs in.

Contract: ``place(config)`` returns ``agents.Agents`` for a run with ``cluster="slurm"``: kept ones
of the same shape, or one ``agent.slurm_node`` agent per node, started as one step of the job
``SLURM_JOB_ID`` names (``srun --overlap``, one task per node, the step's GPUs those the job has).
Each agent connects back over TCP to an address the nodes route to (``NBDDP_SLURM_ADDRESS``, else
this host's address towards the job's first node) and proves the launch's secret, which travels in
the step's environment, never on a command line; other connections are refused and logged. What can
be checked before anything starts is, in one line: no allocation, no ``srun``, a node this
notebook's agents were on that Slurm lost (``agents.say_gone``), more nodes than the job has; then
more GPUs than a node has, or other versions on a node. The step's end (an agent killed, the step
cancelled, a node Slurm lost, the job's time limit) ends the agents' channels, naming why, so their
runs end within seconds.
"""

from __future__ import annotations

import functools
import logging
import os
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time

from nbddp.agent.node import NodeInfo
from nbddp.agent.slurm_node import SECRET
from nbddp.cluster import agents as held
from nbddp.cluster.agents import Agents, Channel, Shape, keep, kept, reuse
from nbddp.cluster.slurm_alloc import Allocation, allocate, cancel_kept, slurm
from nbddp.errors import ConfigError
from nbddp.launcher import settings
from nbddp.launcher.clusters import SlurmCluster
from nbddp.launcher.config import LaunchConfig
from nbddp.launcher.spelling import OptionError
from nbddp.wire.calls import Caller, proven
from nbddp.wire.versions import local_versions, mismatch

log = logging.getLogger(__name__)

PLACE_TIMEOUT = 60.0  # seconds the step's agents get to connect and say where they run
PROVE_TIMEOUT = 5.0  # seconds a new connection gets to prove the secret
END_WAIT = 10.0  # seconds srun gets to end once its agents were told to
GONE_WAIT = 3.0  # seconds a lost agent's step gets to end, so that Slurm says why


def place(config: LaunchConfig) -> Agents:
    cluster = config.cluster
    assert isinstance(cluster, SlurmCluster)
    srun = shutil.which("srun")
    if srun is None:
        raise ConfigError(f"cluster={cluster} needs Slurm's srun on PATH, and it is not there")
    gpus = config.job.world_size // config.nodes if config.job.device == "cuda" else 0
    job = os.environ.get("SLURM_JOB_ID")
    if not cluster.submits and not job:
        raise ConfigError(
            "cluster='slurm' runs on the Slurm allocation this notebook runs in, but it runs "
            "in none (no SLURM_JOB_ID): start Jupyter inside one (salloc -N2 ...), or have "
            "nbddp ask for one: cluster=nbddp.SlurmCluster(partition=..., time=...)"
        )
    where = str(cluster) if cluster.submits else f"Slurm job {job}"
    shape: Shape = (where, config.nodes, gpus, 1)
    if (kept := reuse(shape)) is not None:
        return kept
    if not cluster.submits:
        assert job is not None
        _check_fits(job, config.nodes)
        return keep(_new_agents(srun, job, shape, None))
    allocation = allocate(cluster, config.nodes, gpus)
    try:
        return keep(_new_agents(srun, allocation.job, shape, allocation))
    except BaseException:
        allocation.end()
        raise


def _check_fits(job: str, count: int) -> None:
    names, state = _job_nodes(job)
    # An ended job may still list the node Slurm lost: what is left is what is not down.
    down = slurm("sinfo", "-h", "-N", "-t", "down", "-o", "%N").split()
    where = f"Slurm job {job}" + ("" if state in ("", "RUNNING") else f" ({state})")
    held.say_gone([n for n in names if n not in down], count, where)
    if count > len(names):
        raise OptionError(
            "nodes",
            count,
            lambda s: (
                f"{s.given('nodes', count)} needs {count} nodes, but Slurm job {job} has "
                f"{len(names)}: {', '.join(names) or 'none'}; ask for fewer nodes, or for "
                "more in the allocation (salloc -N)"
            ),
        )


def _scontrol(*args: str) -> str:
    done = subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise ConfigError(f"scontrol {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


def _job_nodes(job: str) -> tuple[list[str], str]:
    """The names of the nodes Slurm job ``job`` holds, in Slurm's order, and its state."""
    fields = dict(f.split("=", 1) for f in _scontrol("show", "job", "-o", job).split() if "=" in f)
    names = _scontrol("show", "hostnames", fields.get("NodeList", "")).split()
    return names, fields.get("JobState", "")


def _notebook_address(first_node: str) -> str:
    """Where the agents reach this process: ``NBDDP_SLURM_ADDRESS``, else the address
    this host sends from towards the job's first node."""
    if configured := settings.read().slurm_address:
        return configured
    fields = _scontrol("show", "node", "-o", first_node).split()
    node = next((f[9:] for f in fields if f.startswith("NodeAddr=")), first_node)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((socket.gethostbyname(node), 9))  # no packet: picks the route only
        return str(probe.getsockname()[0])


def _new_agents(srun: str, job: str, shape: Shape, allocation: Allocation | None) -> Agents:
    _, nodes, gpus, _ = shape
    secret = secrets.token_hex(16)
    address = _notebook_address(_job_nodes(job)[0][0])
    server = socket.create_server((address, 0))
    command = [
        srun, "--overlap", f"--jobid={job}", f"--nodes={nodes}", "--ntasks-per-node=1",
        "--job-name=nbddp-agents", sys.executable, "-m",
        "nbddp.agent.slurm_node", f"{address}:{server.getsockname()[1]}",
    ]  # fmt: skip
    step = subprocess.Popen(
        command,
        env={**os.environ, SECRET: secret},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    engine = SlurmEngine(job, step, allocation)
    try:
        with server:
            callers = _accept(server, secret, nodes, engine)
        infos = [c.call("describe").result(PLACE_TIMEOUT) for c in callers]
        ours = local_versions()
        for caller, info in zip(callers, infos, strict=True):
            assert isinstance(info, NodeInfo)
            caller.name = f"{info.hostname} ({info.address})"
            if problem := mismatch(ours, info.versions, caller.name, ray=False):
                raise ConfigError(problem)
            if len(info.gpu_ids) < gpus:
                raise ConfigError(
                    f"{gpus} GPUs per node, but Slurm gave job {job} {len(info.gpu_ids)} on "
                    f"{info.hostname}; ask for fewer, or for more in the allocation (--gres)"
                )
    except BaseException:
        engine.give_back(step, [])
        raise
    channels: list[Channel] = list(callers)
    return Agents(shape, engine, step, channels, [i for i in infos if isinstance(i, NodeInfo)])


def _accept(server: socket.socket, secret: str, nodes: int, engine: SlurmEngine) -> list[Caller]:
    """The step's agents, in node order, once each has proved ``secret``."""
    server.settimeout(0.2)
    deadline = time.monotonic() + PLACE_TIMEOUT
    while len(engine.callers) < nodes:
        if engine.ended.is_set():
            raise ConfigError(f"Slurm could not start nbddp's agents: {engine.why()}")
        if time.monotonic() > deadline:
            raise ConfigError(
                f"nbddp's agents in Slurm job {engine.job} did not connect within "
                f"{PLACE_TIMEOUT:g}s; set NBDDP_SLURM_ADDRESS to an address of this host "
                "that the nodes can reach"
            )
        try:
            sock, peer = server.accept()
        except TimeoutError:
            continue
        sock.settimeout(PROVE_TIMEOUT)
        try:
            index = proven(sock, secret)
        except (OSError, EOFError, ValueError):
            index = None
        if not isinstance(index, int) or index in engine.callers or not 0 <= index < nodes:
            log.warning("nbddp: refused a connection from %s: not one of this job's agents", peer)
            sock.close()
            continue
        sock.settimeout(None)
        caller = engine.callers[index] = Caller(sock, f"node {index}")
        caller.gone = functools.partial(engine.gone, caller)
    return [engine.callers[i] for i in range(nodes)]


class SlurmEngine(held.Engine):
    """Slurm's side of ``agents.Engine`` for one step of agents: follows the step,
    and closes its agents' channels when it ends (module contract)."""

    def __init__(
        self, job: str, step: subprocess.Popen[str], allocation: Allocation | None
    ) -> None:
        self.job, self.step, self.allocation = job, step, allocation
        self.callers: dict[int, Caller] = {}
        self.ended = threading.Event()
        self._said: list[str] = []  # what srun said of the step's tasks, in order
        self._heard = threading.Condition()
        threading.Thread(target=self._follow, name="nbddp-slurm-step", daemon=True).start()

    def _follow(self) -> None:
        assert self.step.stderr is not None
        for line in self.step.stderr:
            log.info("nbddp: srun: %s", line.rstrip())
            if "error: " in line:
                with self._heard:
                    self._said.append(line.split("error: ", 1)[1].strip(" *\n"))
                    self._heard.notify_all()
            if "Node failure on " in line:  # the node Slurm lost goes first
                name = line.rsplit("Node failure on ", 1)[1].strip()
                for caller in list(self.callers.values()):
                    if caller.name.startswith(f"{name} "):
                        caller.close(self.why(name))
        self.step.wait()
        self.step.stderr.close()
        with self._heard:
            self.ended.set()
            self._heard.notify_all()
        for caller in list(self.callers.values()):
            caller.close(self.why())

    def gone(self, caller: Caller) -> str:
        """Why ``caller``'s agent is gone, once Slurm says (its task's end, the step's),
        or after ``GONE_WAIT``."""
        node = caller.name.split()[0]
        with self._heard:
            self._heard.wait_for(lambda: self.ended.is_set() or self._about(node), GONE_WAIT)
        return self.why(node)

    def _about(self, node: str) -> str | None:
        if (loss := f"Node failure on {node}") in self._said:  # its own, whenever srun said it
            return loss
        # A task cancelled for another node's failure is not its own node's loss: the
        # failed node's line is waited for (``gone``), so the run names that node.
        mine = (s for s in self._said if s.startswith(f"{node}: ") or f" ON {node} " in s)
        return next((s for s in mine if "DUE TO NODE FAILURE" not in s), None)

    def why(self, node: str = "") -> str:
        """Why the step, or ``node``'s task of it, ended, in Slurm's words where it gave some."""
        if any("TIME LIMIT" in s for s in self._said):
            return f"Slurm job {self.job} reached its time limit"
        said = (self._about(node) if node else None) or (self._said[0] if self._said else None)
        if said:
            return f"Slurm: {said}"
        if self.step.returncode is None:
            return f"the agent on {node or 'a node'} ended its connection"
        return f"the agents' step ended (srun exited with {self.step.returncode})"

    def give_back(self, hold: object, channels: list[Channel]) -> None:
        """Close the agents' channels (each agent then ends its ranks and itself) and
        wait for the step to end, killing ``srun`` if it does not."""
        for caller in list(self.callers.values()):
            caller.close("handed back")
        try:
            self.step.wait(END_WAIT)
        except subprocess.TimeoutExpired:
            log.warning("nbddp: srun for job %s did not end; killing it", self.job)
            self.step.kill()
            self.step.wait()
        if self.allocation is not None:
            self.allocation.end()

    def note(self) -> str:
        left = slurm("squeue", "-h", "-j", self.job, "-o", "%L").strip()
        return f"time left {left}" if left else ""


def end_kept() -> None:
    """End the kept allocations this process asked for that no agents hold."""
    busy = {a.engine.job for a in kept() if isinstance(a.engine, SlurmEngine)}
    cancel_kept(busy)
