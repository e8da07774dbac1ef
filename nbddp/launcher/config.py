"""``LaunchConfig``: a launch's options, validated before any process starts, by reader.

Contract: ``LaunchConfig.build(**options)`` takes ``options.LaunchOptions`` (and the keywords with
which the entry points wire a launch) and returns a config whose every part is valid and resolved,
or raises ``OptionError`` (one line: the option, its value, what to do). Each option is checked on
its own (``checks``), combinations here. Parts by reader: ``job`` (``JobSpec``: what starts and
stops the ranks), ``view`` (``ViewSpec``: what the display reads), ``nodes`` and ``cluster``. A
machine's share of a run is a ``NodeSlice``, and ``JobSpec.rank_env`` is the one place that builds a
rank's torchrun variables. Nothing here starts a process, initialises CUDA or keeps a port.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from nbddp.launcher import settings
from nbddp.launcher.checks import Values, check_env
from nbddp.launcher.clusters import Cluster
from nbddp.launcher.devices import VisibleGpus, cuda_initialised, visible_gpus
from nbddp.launcher.execenv import exec_env_problem, working_directory
from nbddp.launcher.options import (
    DEFAULT_TAIL,
    DEFAULTS,
    OPTIONS,
    Backend,
    LaunchOptions,
    StartMethod,
)
from nbddp.launcher.options import Output as OutputChoice
from nbddp.launcher.spelling import OptionError, Say, Spelling
from nbddp.wire.protocol import DeviceKind

if TYPE_CHECKING:
    from typing_extensions import Unpack

DEFAULT_CPU_PROCS = 2


@dataclass(frozen=True)
class NodeSlice:
    """The ranks of a run that one machine starts: global ranks ``first_rank`` on
    (``ranks`` of them, on ``gpu_tokens``), meeting at ``master_addr:port``; ``port``
    None: this machine hosts the store on a port of its choice."""

    node_rank: int
    nodes: int
    first_rank: int
    ranks: int
    master_addr: str
    port: int | None
    gpu_tokens: tuple[str, ...] = ()
    address: str = ""
    """The node's own address, on a cluster (empty: this machine)."""

    @property
    def global_ranks(self) -> range:
        """The run's ranks this machine starts."""
        return range(self.first_rank, self.first_rank + self.ranks)

    def __str__(self) -> str:
        return f"node {self.node_rank} ({self.address})"


@dataclass(frozen=True)
class JobSpec:
    """What starts and stops a run's ranks."""

    world_size: int
    """Ranks in the whole run (torch's ``WORLD_SIZE``), one process each."""
    device: DeviceKind
    """``cuda``: one GPU per rank; ``cpu``: GPUs hidden from the ranks;
    ``inherit``: the ranks see what the notebook sees (``spawn()`` semantics)."""
    gpu_tokens: tuple[str, ...] = ()
    """``CUDA_VISIBLE_DEVICES`` entries of the ranks on this machine (device ``cuda``)."""
    backend: Backend = "gloo"
    """The process-group backend: nccl on GPUs, gloo on CPU."""
    start_method: StartMethod = "forkserver"
    """forkserver: fork from a torch-preloaded server that never touched CUDA.
    spawn: a fresh interpreter per rank. fork: fork the notebook itself."""
    master_addr: str = "127.0.0.1"
    """Rendezvous address (``MASTER_ADDR``)."""
    port: int | None = None
    """Rendezvous port (``MASTER_PORT``); None picks a free one per run."""
    port_fallback: bool = False
    """When ``port`` is busy: True picks another (with a notice), False raises."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment variables for every rank (over the notebook's own)."""
    timeout: float | None = None
    """Seconds before the whole run is stopped; None waits forever."""
    mixed_precision: str = "no"
    """Exported as ``ACCELERATE_MIXED_PRECISION`` so ``Accelerator()`` sees it."""
    init_process_group: bool = False
    """Initialise the default process group before calling the function."""
    debug: bool = False
    """A rank that raises opens a debugger on the raising frame before it reports."""
    max_restarts: int = 0
    """After a failure, start every rank again (a fresh port), at most this often."""
    restart_count: int = 0
    """Which restart this is (``TORCHELASTIC_RESTART_COUNT``, as torchrun sets it)."""
    host_store: bool = True
    """The notebook hosts the rendezvous store (``TORCHELASTIC_USE_AGENT_STORE``, as
    torchrun's agent does) on a socket bound to ``master_addr`` only; otherwise rank 0
    hosts it. Off for ``spawn()``, whose users often set ``MASTER_PORT`` themselves."""
    failure_grace: float = 1.0
    """Seconds the other ranks get after one fails (to report their own errors)
    before they are stopped; they would otherwise hang in a collective."""
    kill_grace: float = 3.0
    """Seconds between SIGTERM and SIGKILL when stopping a rank."""
    pool_max: int = int(settings.POOL.default)
    """``NBDDP_POOL``: the most idle workers the forkserver keeps after a launch."""
    pool_idle: float = settings.POOL_IDLE.default
    """``NBDDP_POOL_IDLE``: seconds without a launch before idle workers end."""

    def local(self) -> NodeSlice:
        """The whole run, on this machine."""
        return NodeSlice(0, 1, 0, self.world_size, self.master_addr, None, self.gpu_tokens)

    def rank_env(self, node: NodeSlice, local: int, port: int) -> dict[str, str]:
        """The environment of ``node``'s ``local``-th rank, as torchrun gives it."""
        rank = node.first_rank + local
        env = {
            "RANK": str(rank),
            "LOCAL_RANK": str(local),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_WORLD_SIZE": str(node.ranks),
            "GROUP_RANK": str(node.node_rank),
            "NODE_RANK": str(node.node_rank),
            "ROLE_RANK": str(rank),
            "ROLE_WORLD_SIZE": str(self.world_size),
            "MASTER_ADDR": node.master_addr,
            "MASTER_PORT": str(port),
            "PYTHONUNBUFFERED": "1",
            "ACCELERATE_MIXED_PRECISION": self.mixed_precision,
            "TORCHELASTIC_RUN_ID": "nbddp",
            "TORCHELASTIC_RESTART_COUNT": str(self.restart_count),
            "TORCHELASTIC_MAX_RESTARTS": str(self.max_restarts),
        }
        if self.host_store:
            env["TORCHELASTIC_USE_AGENT_STORE"] = "True"
        if self.device == "cuda":
            env["CUDA_VISIBLE_DEVICES"] = ",".join(node.gpu_tokens)
        elif self.device == "cpu":
            # Hide GPUs so code that picks "cuda if available" runs on CPU,
            # and tell accelerate explicitly (it would otherwise look for GPUs).
            env["CUDA_VISIBLE_DEVICES"] = ""
            env["ACCELERATE_USE_CPU"] = "true"
        if "OMP_NUM_THREADS" not in os.environ and "OMP_NUM_THREADS" not in self.env:
            env["OMP_NUM_THREADS"] = str(self.threads(node.ranks))
        if "SLURM_JOB_ID" in os.environ:
            env.update(_slurm_task(node, local, self.world_size))
        env.update(self.env)
        return env

    def threads(self, local_ranks: int) -> int | None:
        """The thread count each rank gives torch: ``OMP_NUM_THREADS`` from ``env``, else the
        notebook's, when a whole number; with neither, as torchrun, the cores shared among the
        machine's ``local_ranks``. None when the setting is not a number (OpenMP reads it)."""
        given = self.env.get("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS"))
        if given is None:
            return max(1, (os.cpu_count() or 1) // local_ranks)
        given = given.strip()
        return int(given) if given.isdigit() and int(given) > 0 else None


@dataclass(frozen=True)
class ViewSpec:
    """What the display reads."""

    output: OutputChoice = "all"
    """Whose output is shown: every rank, rank 0, or none (all are logged regardless)."""
    tail: int = DEFAULT_TAIL
    """In a notebook, how many recent lines each rank's block shows."""
    notices: tuple[Say, ...] = field(default=(), compare=False)
    """Notices for the user about defaults that were chosen, in the words of the entry
    point that shows them (``spelling.spoken``)."""

    @property
    def shown_ranks(self) -> set[int] | None:
        """The ranks whose output ``output`` shows: all (None), rank 0, or none."""
        return {"all": None, "rank0": {0}, "none": set()}[self.output]


@dataclass(frozen=True)
class LaunchConfig:
    """A validated launch (``build``): ``job`` starts the ranks, ``view`` is what the
    display reads, ``nodes`` and ``cluster`` the cluster a run spans, if any."""

    job: JobSpec
    view: ViewSpec = ViewSpec()
    nodes: int = 1
    """Machines the run spans (``job.world_size`` counts the ranks of all of them)."""
    cluster: Cluster | None = None
    """The cluster the run goes to (``nbddp.cluster``); None: this machine."""

    @classmethod
    def build(
        cls,
        *,
        visible: VisibleGpus | None = None,
        environ: Mapping[str, str] | None = None,
        inherit_devices: bool = False,
        host_store: bool = True,
        port_fallback: bool = False,
        **options: Unpack[LaunchOptions],
    ) -> LaunchConfig:
        """Validate launch ``options`` and resolve defaults. With neither ``gpus`` nor ``procs``:
        every visible GPU (``visible``, default: detected without CUDA), or with none visible,
        ``DEFAULT_CPU_PROCS`` CPU processes and a notice. ``inherit_devices`` (with ``procs``)
        leaves ``CUDA_VISIBLE_DEVICES`` as the notebook has it. ``environ`` (default
        ``os.environ``, under ``env``) gives the ``NBDDP_*`` settings. ``env`` may not set a
        variable that nbddp sets itself."""
        if unknown := sorted(set(options) - set(OPTIONS)):
            raise TypeError(
                f"LaunchConfig.build() got an unexpected keyword argument {unknown[0]!r}"
            )
        values = Values.check({**DEFAULTS, **options})
        cluster = _cluster(values)
        vis = visible if visible is not None else visible_gpus()
        place = _place_nodes(values) if cluster else _place(values, vis, inherit_devices)
        rank_environ = {**(os.environ if environ is None else environ), **values.env}
        chosen = settings.read(rank_environ)
        job = JobSpec(
            world_size=place.world_size,
            device=place.device,
            gpu_tokens=place.tokens,
            backend=_backend(values.backend, place.device),
            start_method=_start_method(values.start_method, place.device, rank_environ),
            master_addr=values.master_addr,
            port=values.port,
            port_fallback=port_fallback,
            env=values.env,
            timeout=values.timeout,
            mixed_precision=values.mixed_precision,
            init_process_group=values.init_process_group,
            debug=values.debug,
            max_restarts=values.max_restarts,
            host_store=bool(host_store),
            pool_max=chosen.pool,
            pool_idle=chosen.pool_idle,
        )
        # What nbddp sets depends on the resolved launch (devices, store): ask rank_env.
        check_env(job.env, set(replace(job, env={}).rank_env(job.local(), 0, 1)))
        view = ViewSpec(values.output, values.tail, place.notices)
        return cls(job, view, values.nodes, cluster)


def _backend(chosen: Backend | None, device: DeviceKind) -> Backend:
    """The backend asked for, else nccl on GPUs and gloo on CPU; nccl needs GPUs."""
    backend: Backend = chosen or ("nccl" if device == "cuda" else "gloo")
    if backend == "nccl" and device == "cpu":
        raise OptionError(
            "backend",
            backend,
            lambda s: (
                f"backend 'nccl' needs GPUs; use {s.hole('gpus', 'N')}, "
                f"or {s.given('backend', 'gloo')} on CPU"
            ),
        )
    return backend


def _start_method(
    method: StartMethod, device: DeviceKind, environ: Mapping[str, str]
) -> StartMethod:
    """The start method, once every rank can be started with it: in the notebook's
    working directory, which must exist; with spawn, an environment ``execve`` can
    take (``execenv``); with fork, not GPU ranks once this process has initialised
    CUDA (a forked child cannot use it: the rank would fail far from the cause)."""
    working_directory()
    problem = exec_env_problem(environ) if method == "spawn" else None
    if problem is not None:
        raise OptionError(
            "start_method",
            method,
            lambda s: (
                f"{problem}: a spawned rank could not start; pass large data as an "
                f"argument or in a file instead, or use {s.given('start_method', 'forkserver')}"
            ),
        )
    if method == "fork" and device != "cpu" and cuda_initialised():
        raise OptionError(
            "start_method",
            method,
            lambda s: (
                f"{s.given('start_method', 'fork')} cannot start GPU ranks after this "
                "process has initialised CUDA (a forked child cannot use CUDA); use the default "
                f"{s.given('start_method', 'forkserver')}, or {s.given('start_method', 'spawn')}"
            ),
        )
    return method


@dataclass(frozen=True)
class _Placement:
    """Where the ranks run: how many, on which devices."""

    world_size: int
    device: DeviceKind
    tokens: tuple[str, ...] = ()
    notices: tuple[Say, ...] = ()


def _both(values: Values, gpus: str, procs: str) -> None:
    if values.gpus is not None and values.procs is not None:
        raise OptionError(
            "procs",
            values.procs,
            lambda s: (
                f"give either {s.hole('gpus', 'N')} ({gpus}) or {s.hole('procs', 'N')} "
                f"({procs}), not both"
            ),
        )


def _place(values: Values, vis: VisibleGpus, inherit_devices: bool) -> _Placement:
    _both(values, "one process per GPU", "CPU processes")
    if values.procs is not None:
        return _Placement(values.procs, "inherit" if inherit_devices else "cpu")
    if values.gpus is not None:
        tokens = _select_gpus(values.gpus, vis)
        return _Placement(len(tokens), "cuda", tokens)
    if len(vis) > 0:
        return _Placement(len(vis.tokens), "cuda", vis.tokens)

    def notice(s: Spelling) -> str:
        return (
            f"no GPU visible: running {DEFAULT_CPU_PROCS} CPU processes (gloo); "
            f"pass {s.hole('procs', 'N')} to choose how many"
        )

    return _Placement(DEFAULT_CPU_PROCS, "cpu", notices=(notice,))


def _slurm_task(node: NodeSlice, local: int, world_size: int) -> dict[str, str]:
    """Slurm's per-task variables as a rank's, where it runs inside a Slurm job: Slurm gives every
    process of a step the step's own numbers (one task per node for nbddp's agents, one task for a
    notebook), which Lightning and submitit would read instead of torch's."""
    rank, tasks = str(node.first_rank + local), str(world_size)
    return {
        "SLURM_PROCID": rank,
        "SLURM_LOCALID": str(local),
        "SLURM_NODEID": str(node.node_rank),
        "SLURM_NTASKS": tasks,
        "SLURM_NPROCS": tasks,
        "SLURM_STEP_NUM_TASKS": tasks,
        "SLURM_NTASKS_PER_NODE": str(node.ranks),
        "SLURM_TASKS_PER_NODE": f"{node.ranks}(x{node.nodes})",
        "SLURM_STEP_TASKS_PER_NODE": f"{node.ranks}(x{node.nodes})",
        "SLURM_GTIDS": ",".join(str(r) for r in node.global_ranks),
    }


def _cluster(values: Values) -> Cluster | None:
    """The cluster of a run across nodes, once the options fit one (None: this machine)."""
    if values.cluster is None:
        if values.nodes > 1:
            raise OptionError(
                "nodes",
                values.nodes,
                lambda s: (
                    f"{s.given('nodes', values.nodes)} needs a cluster: add "
                    f"{s.given('cluster', 'slurm')} inside a Slurm allocation, or "
                    f"{s.given('cluster', 'ray://head:10001')} (or 'ray' inside a Ray cluster)"
                ),
            )
        return None
    if values.start_method == "fork":
        raise OptionError(
            "start_method",
            "fork",
            lambda s: (
                f"{s.given('start_method', 'fork')} cannot start ranks on a cluster's "
                f"nodes; use the default {s.given('start_method', 'forkserver')}"
            ),
        )
    if values.max_restarts:
        raise OptionError(
            "max_restarts",
            values.max_restarts,
            lambda s: (
                f"{s.name('max_restarts')} is not supported on a cluster yet; "
                f"use {s.given('max_restarts', 0)} there"
            ),
        )
    return values.cluster


def _place_nodes(values: Values) -> _Placement:
    """Ranks per node on a cluster: a GPU count or CPU processes (the nodes' GPUs are
    checked when the run starts, against what the cluster has)."""
    _both(values, "GPUs per node", "CPU processes per node")
    if isinstance(values.gpus, tuple):
        raise OptionError(
            "gpus",
            values.gpus,
            lambda s: (
                f"on a cluster {s.name('gpus')} is a count per node, such as "
                f"{s.given('gpus', 8)}, not GPU ids"
            ),
        )
    if values.gpus is not None:
        return _Placement(values.gpus * values.nodes, "cuda")
    if values.procs is not None:
        return _Placement(values.procs * values.nodes, "cpu")
    raise OptionError(
        "nodes",
        values.nodes,
        lambda s: (
            f"on a cluster, say how many ranks each node runs: {s.hole('gpus', 'N')} "
            f"(one per GPU) or {s.hole('procs', 'N')} (CPU processes)"
        ),
    )


def _select_gpus(gpus: int | tuple[int, ...], vis: VisibleGpus) -> tuple[str, ...]:
    """The ``CUDA_VISIBLE_DEVICES`` tokens of a checked GPU request, if they are visible."""
    if isinstance(gpus, tuple):
        hidden = [gid for gid in gpus if gid >= len(vis)]
        if hidden:
            raise OptionError(
                "gpus", gpus, lambda s: f"GPU id {hidden[0]} is not visible: {vis.describe()}"
            )
        return tuple(vis.tokens[i] for i in gpus)
    if gpus <= len(vis):
        return vis.tokens[:gpus]

    def too_many(s: Spelling) -> str:
        asked = f"{s.given('gpus', gpus)} asked for {gpus} GPUs"
        on_cpu = f"{s.given('procs', gpus)} to run on CPU"
        if not len(vis):
            return f"{asked} but none is visible ({vis.source}); use {on_cpu}"
        fewer = f"{asked} but {vis.describe()}; use {s.given('gpus', len(vis))}"
        return f"{fewer}, or {on_cpu}" if s.cpu_over_gpus else fewer

    raise OptionError("gpus", gpus, too_many)
