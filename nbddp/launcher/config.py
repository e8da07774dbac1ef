"""``LaunchConfig``: every launch option, validated before any process starts.

Contract: ``LaunchConfig.build(**options)`` takes the options of
``options.LaunchOptions`` (plus a few keywords with which the entry points
wire a launch) and either returns a config whose every field is valid and
resolved (world size, GPU tokens, backend, start method, display, the
forkserver pool's settings) or raises ``ConfigError`` with a one-line message
that says what is wrong and what to do. ``check_option`` is the same check of
one option on its own (the panel checks each field with it); what only a
combination shows (gpus and procs, GPUs that are not visible, nccl on CPU) is
checked by ``build`` alone.

Nothing here starts a process, initialises CUDA or binds a port for longer
than a check. The port itself is chosen at launch time
(``ports.choose_port``) because a port free now may be taken by then. The
environment (``NBDDP_POOL``, ``NBDDP_POOL_IDLE``) is read when the config is
built.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, TypeVar, cast

from nbddp.errors import ConfigError
from nbddp.launcher import settings
from nbddp.launcher.devices import VisibleGpus, cuda_initialised, visible_gpus
from nbddp.launcher.execenv import exec_env_problem, working_directory
from nbddp.launcher.options import (
    DEFAULT_TAIL,
    DEFAULTS,
    OPTIONS,
    Backend,
    LaunchOptions,
    MixedPrecision,
    Output,
    StartMethod,
)
from nbddp.launcher.raycluster import RayCluster, as_cluster
from nbddp.launcher.reserved import check_env
from nbddp.launcher.spelling import KEYWORDS, Spelling
from nbddp.wire.protocol import DeviceKind

if TYPE_CHECKING:
    from typing_extensions import Unpack

DEFAULT_CPU_PROCS = 2

S = TypeVar("S", bound=str)


@dataclass(frozen=True)
class NodeSlice:
    """One node's part of a run across nodes (``nbddp.cluster``): the node's ranks are
    global ranks ``first_rank`` on, of ``world_size``, meeting at ``master_addr:port``
    (a store another process hosts, already listening)."""

    node_rank: int
    nodes: int
    first_rank: int
    world_size: int
    master_addr: str
    port: int


@dataclass(frozen=True)
class LaunchConfig:
    """A validated launch. Build it with ``LaunchConfig.build``."""

    world_size: int
    """Number of ranks (one process each)."""
    device: DeviceKind
    """``cuda``: one GPU per rank; ``cpu``: GPUs hidden from the ranks;
    ``inherit``: the ranks see what the notebook sees (``spawn()`` semantics)."""
    gpu_tokens: tuple[str, ...] = ()
    """``CUDA_VISIBLE_DEVICES`` entries given to every rank (device ``cuda``)."""
    backend: Backend = "gloo"
    """The process-group backend the ranks should use: nccl on GPUs, gloo on CPU."""
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
    mixed_precision: MixedPrecision = "no"
    """Exported as ``ACCELERATE_MIXED_PRECISION`` so ``Accelerator()`` sees it."""
    init_process_group: bool = False
    """Initialise the default process group before calling the function."""
    max_restarts: int = 0
    """After a failure, stop every rank and start them all again (a fresh port), at most
    this many times (``launcher.restarts``)."""
    restart_count: int = 0
    """Which restart this launch is (``TORCHELASTIC_RESTART_COUNT``, as torchrun sets it)."""
    host_store: bool = True
    """The notebook hosts the rendezvous store (``TORCHELASTIC_USE_AGENT_STORE``, as
    torchrun's agent does) on a socket bound to ``master_addr`` only; otherwise rank 0
    hosts it and torch binds it on every interface. Off for ``spawn()``, whose users
    often set ``MASTER_PORT`` themselves inside the function."""
    failure_grace: float = 1.0
    """Seconds the other ranks get after one fails (to report their own
    errors) before they are stopped; they would otherwise hang in a collective."""
    kill_grace: float = 3.0
    """Seconds between SIGTERM and SIGKILL when stopping a rank."""
    output: Output = "all"
    """Whose output is shown: every rank, rank 0, or none (all are logged regardless)."""
    tail: int = DEFAULT_TAIL
    """In a notebook, how many recent lines each rank's block shows."""
    pool_max: int = int(settings.POOL.default)
    """``NBDDP_POOL``: the most idle workers the forkserver keeps after a launch (0: none)."""
    pool_idle: float = settings.POOL_IDLE.default
    """``NBDDP_POOL_IDLE``: seconds without a launch before idle workers end."""
    nodes: int = 1
    """Machines the run spans (``world_size`` counts the ranks of all of them)."""
    cluster: RayCluster | None = None
    """The Ray cluster the run goes to (``nbddp.cluster``); None: this machine."""
    node: NodeSlice | None = None
    """Set only in a cluster's agent: this node's part of the run (``world_size`` is
    then the node's own ranks)."""
    notices: tuple[str, ...] = ()
    """One-line notices for the user about defaults that were chosen."""
    spelling: Spelling = field(default=KEYWORDS, compare=False)
    """How the entry point that built this config spells the options (its messages'
    words, also for the checks made after ``build``)."""

    @classmethod
    def build(
        cls,
        *,
        visible: VisibleGpus | None = None,
        environ: Mapping[str, str] | None = None,
        inherit_devices: bool = False,
        host_store: bool = True,
        port_fallback: bool = False,
        failure_grace: float = 1.0,
        kill_grace: float = 3.0,
        spelling: Spelling = KEYWORDS,
        **options: Unpack[LaunchOptions],
    ) -> LaunchConfig:
        """Validate launch ``options`` and resolve defaults (see module contract).

        With neither ``gpus`` nor ``procs``: every visible GPU (``visible``,
        default: detected without CUDA), or with none visible,
        ``DEFAULT_CPU_PROCS`` CPU processes and a notice. ``inherit_devices``
        (with ``procs``) leaves ``CUDA_VISIBLE_DEVICES`` as the notebook has
        it instead of hiding the GPUs. ``environ`` (default ``os.environ``,
        under ``env``) gives the pool settings. ``spelling``: how the caller spells
        the options; every message names them so. ``env`` may not set a variable
        that nbddp sets itself (``rank_env``), except those users may tune, nor
        hold a NUL byte. The start must be possible (``_start_method``).
        """
        _no_unknown(options)
        spell = spelling
        values = _Values.check({**DEFAULTS, **options}, spell)
        vis = visible if visible is not None else visible_gpus()
        cluster = _cluster(values, spell)
        place = (
            _place_nodes(values, spell) if cluster else _place(values, vis, inherit_devices, spell)
        )
        backend = _backend(values.backend, place.device, spell)
        rank_environ = {**(os.environ if environ is None else environ), **values.env}
        chosen = settings.read(rank_environ)
        config = cls(
            world_size=place.world_size,
            device=place.device,
            gpu_tokens=place.tokens,
            backend=backend,
            start_method=_start_method(values.start_method, place.device, rank_environ, spell),
            master_addr=values.master_addr,
            port=values.port,
            port_fallback=port_fallback,
            env=values.env,
            timeout=values.timeout,
            mixed_precision=values.mixed_precision,
            init_process_group=values.init_process_group,
            max_restarts=values.max_restarts,
            host_store=bool(host_store),
            failure_grace=_non_negative("failure_grace", failure_grace),
            kill_grace=_non_negative("kill_grace", kill_grace),
            output=values.output,
            tail=values.tail,
            pool_max=chosen.pool,
            pool_idle=chosen.pool_idle,
            nodes=values.nodes,
            cluster=cluster,
            notices=place.notices,
            spelling=spell,
        )
        # What nbddp sets depends on the resolved launch (devices, store): ask rank_env.
        check_env(config.env, set(replace(config, env={}).rank_env(0, 1)), spell)
        return config

    def for_node(self, node: NodeSlice, ranks: int, gpu_tokens: tuple[str, ...]) -> LaunchConfig:
        """This run's part on one node of a cluster: ``ranks`` ranks there, on ``gpu_tokens``."""
        return replace(
            self,
            world_size=ranks,
            gpu_tokens=gpu_tokens,
            master_addr=node.master_addr,
            port=node.port,
            cluster=None,
            node=node,
            notices=(),
        )

    def global_rank(self, local: int) -> int:
        """The global rank of this node's ``local``-th rank (one node: the same)."""
        return local + (self.node.first_rank if self.node is not None else 0)

    @property
    def total_ranks(self) -> int:
        """The ranks of the whole run, on every node."""
        return self.node.world_size if self.node is not None else self.world_size

    def rank_env(self, rank: int, port: int) -> dict[str, str]:
        """The torch.distributed environment of this node's ``rank``-th rank, as torchrun
        gives it (one node: local == global)."""
        glob, node_rank = self.global_rank(rank), self.node.node_rank if self.node else 0
        env = {
            "RANK": str(glob),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(self.total_ranks),
            "LOCAL_WORLD_SIZE": str(self.world_size),
            "GROUP_RANK": str(node_rank),
            "NODE_RANK": str(node_rank),
            "ROLE_RANK": str(glob),
            "ROLE_WORLD_SIZE": str(self.total_ranks),
            "MASTER_ADDR": self.master_addr,
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
            env["CUDA_VISIBLE_DEVICES"] = ",".join(self.gpu_tokens)
        elif self.device == "cpu":
            # Hide GPUs so code that picks "cuda if available" runs on CPU,
            # and tell accelerate explicitly (it would otherwise look for GPUs).
            env["CUDA_VISIBLE_DEVICES"] = ""
            env["ACCELERATE_USE_CPU"] = "true"
        if "OMP_NUM_THREADS" not in os.environ and "OMP_NUM_THREADS" not in self.env:
            env["OMP_NUM_THREADS"] = str(self.threads)
        env.update(self.env)
        return env

    @property
    def shown_ranks(self) -> set[int] | None:
        """The ranks whose output ``output`` shows: all (None), rank 0, or none."""
        return {"all": None, "rank0": {0}, "none": set()}[self.output]

    @property
    def threads(self) -> int | None:
        """The thread count each rank gives torch: ``OMP_NUM_THREADS`` from ``env``,
        else the notebook's, when it is a whole number; with neither, as torchrun,
        the cores shared among the ranks (so N ranks do not each start a thread per
        core). None when the setting given is not a number (OpenMP reads it itself)."""
        given = self.env.get("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS"))
        if given is None:
            return max(1, (os.cpu_count() or 1) // self.world_size)
        given = given.strip()
        return int(given) if given.isdigit() and int(given) > 0 else None


def _backend(chosen: Backend | None, device: DeviceKind, spell: Spelling) -> Backend:
    """The backend asked for, else nccl on GPUs and gloo on CPU; nccl needs GPUs."""
    backend: Backend = chosen or ("nccl" if device == "cuda" else "gloo")
    if backend == "nccl" and device == "cpu":
        raise ConfigError(
            f"backend 'nccl' needs GPUs; use {spell.hole('gpus', 'N')}, "
            f"or {spell.given('backend', 'gloo')} on CPU"
        )
    return backend


def _no_unknown(options: Mapping[str, object]) -> None:
    if unknown := sorted(set(options) - set(OPTIONS)):
        raise TypeError(f"LaunchConfig.build() got an unexpected keyword argument {unknown[0]!r}")


def _start_method(
    method: StartMethod, device: DeviceKind, environ: Mapping[str, str], spell: Spelling
) -> StartMethod:
    """The start method, once the ranks can be started with it: every rank starts
    in the notebook's working directory, which must exist; spawned ranks get
    their environment through ``execve``, which must be able to take it
    (``execenv``); and fork cannot start ranks that use GPUs once this process
    has initialised CUDA (a forked child cannot use it: the rank would fail at
    its first CUDA call, far from the cause)."""
    _check_start(method, environ, spell)
    if method == "fork" and device != "cpu" and cuda_initialised():
        raise ConfigError(
            f"{spell.given('start_method', 'fork')} cannot start GPU ranks after this "
            "process has initialised CUDA (a forked child cannot use CUDA); use the "
            f"default {spell.given('start_method', 'forkserver')}, or "
            f"{spell.given('start_method', 'spawn')}"
        )
    return method


def _check_start(method: StartMethod, environ: Mapping[str, str], spell: Spelling) -> None:
    """What every rank needs of the notebook to start: its working directory, and
    with spawn an environment a new program can be given (``execenv``)."""
    working_directory()
    if method != "spawn":
        return  # forked ranks get their environment in their order, not through execve
    problem = exec_env_problem(environ)
    if problem is not None:
        raise ConfigError(
            f"{problem}: a spawned rank could not start; pass large data as an argument "
            f"or in a file instead, or use {spell.given('start_method', 'forkserver')}"
        )


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be a positive whole number, got {value!r}")
    if value < 1:
        raise ConfigError(f"{name} must be at least 1, got {value}")
    return value


@dataclass(frozen=True)
class _Values:
    """Every launch option's value, each checked on its own."""

    gpus: int | tuple[int, ...] | None
    procs: int | None
    start_method: StartMethod
    port: int | None
    master_addr: str
    timeout: float | None
    env: dict[str, str]
    mixed_precision: MixedPrecision
    backend: Backend | None
    init_process_group: bool
    max_restarts: int
    output: Output
    tail: int
    nodes: int
    cluster: RayCluster | None

    @classmethod
    def check(cls, options: LaunchOptions, spell: Spelling) -> _Values:
        """Raise ``ConfigError`` for the first option whose value is wrong in itself."""
        procs, backend = options["procs"], options["backend"]
        return cls(
            gpus=_gpu_request(options["gpus"], spell),
            procs=None if procs is None else _positive_int(spell.name("procs"), procs),
            start_method=_choice("start_method", options["start_method"], spell),
            port=_port(options["port"], spell),
            master_addr=_master_addr(options["master_addr"], spell),
            timeout=_positive_float("timeout", options["timeout"], spell),
            env=_env(options["env"], spell),
            mixed_precision=_choice("mixed_precision", _lower(options["mixed_precision"]), spell),
            backend=None if backend is None else _choice("backend", backend, spell),
            init_process_group=bool(options["init_process_group"]),
            max_restarts=_restarts(options["max_restarts"], spell),
            output=_choice("output", options["output"], spell),
            tail=_tail(options["tail"], spell),
            nodes=_positive_int(spell.name("nodes"), options["nodes"]),
            cluster=as_cluster(options["cluster"], spell.name("cluster")),
        )


def check_option(name: str, value: object, spelling: Spelling = KEYWORDS) -> None:
    """Raise ``ConfigError`` if ``value`` is wrong for option ``name`` in itself (whatever
    the other options are); ``build`` may still refuse a combination."""
    if name not in OPTIONS:
        raise ValueError(f"no launch option is named {name!r}")
    _Values.check(cast(LaunchOptions, {**DEFAULTS, name: value}), spelling)


@dataclass(frozen=True)
class _Placement:
    """Where the ranks run: how many, on which devices."""

    world_size: int
    device: DeviceKind
    tokens: tuple[str, ...] = ()
    notices: tuple[str, ...] = ()


def _place(values: _Values, vis: VisibleGpus, inherit_devices: bool, spell: Spelling) -> _Placement:
    if values.gpus is not None and values.procs is not None:
        raise ConfigError(
            f"give either {spell.hole('gpus', 'N')} (one process per GPU) or "
            f"{spell.hole('procs', 'N')} (CPU processes), not both"
        )
    if values.procs is not None:
        return _Placement(values.procs, "inherit" if inherit_devices else "cpu")
    if values.gpus is not None:
        tokens = _select_gpus(values.gpus, vis, spell)
        return _Placement(len(tokens), "cuda", tokens)
    if len(vis) > 0:
        return _Placement(len(vis.tokens), "cuda", vis.tokens)
    notice = (
        f"no GPU visible: running {DEFAULT_CPU_PROCS} CPU processes (gloo); "
        f"pass {spell.hole('procs', 'N')} to choose how many"
    )
    return _Placement(DEFAULT_CPU_PROCS, "cpu", notices=(notice,))


def _cluster(values: _Values, spell: Spelling) -> RayCluster | None:
    """The cluster of a run across nodes, once the options fit one (None: this machine)."""
    if values.cluster is None:
        if values.nodes > 1:
            raise ConfigError(
                f"{spell.given('nodes', values.nodes)} needs a Ray cluster: add "
                f"{spell.given('cluster', 'ray://head:10001')} (or 'ray' inside one)"
            )
        return None
    if values.start_method == "fork":
        raise ConfigError(
            f"{spell.given('start_method', 'fork')} cannot start ranks on a cluster's nodes; "
            f"use the default {spell.given('start_method', 'forkserver')}"
        )
    if values.max_restarts:
        raise ConfigError(
            f"{spell.name('max_restarts')} is not supported on a cluster yet; "
            f"use {spell.given('max_restarts', 0)} there"
        )
    return values.cluster


def _place_nodes(values: _Values, spell: Spelling) -> _Placement:
    """Ranks per node on a cluster: a GPU count or CPU processes (the nodes' GPUs are
    checked when the run starts, against what the cluster has)."""
    if values.gpus is not None and values.procs is not None:
        raise ConfigError(
            f"give either {spell.hole('gpus', 'N')} (GPUs per node) or "
            f"{spell.hole('procs', 'N')} (CPU processes per node), not both"
        )
    if isinstance(values.gpus, tuple):
        raise ConfigError(
            f"on a cluster {spell.name('gpus')} is a count per node, such as "
            f"{spell.given('gpus', 8)}, not GPU ids"
        )
    if values.gpus is not None:
        return _Placement(values.gpus * values.nodes, "cuda")
    if values.procs is not None:
        return _Placement(values.procs * values.nodes, "cpu")
    raise ConfigError(
        f"on a cluster, say how many ranks each node runs: {spell.hole('gpus', 'N')} "
        f"(one per GPU) or {spell.hole('procs', 'N')} (CPU processes)"
    )


def _gpu_request(gpus: object, spell: Spelling) -> int | tuple[int, ...] | None:
    """A GPU count, or GPU ids (notebook ordinals), as far as they can be checked alone."""
    name = spell.name("gpus")
    if gpus is None:
        return None
    if isinstance(gpus, str):
        raise ConfigError(
            f"{name} must be a count or a list of GPU ids such as "
            f"{spell.given('gpus', [0, 1])}, got the string {gpus!r}"
        )
    if isinstance(gpus, int) and not isinstance(gpus, bool):
        return _positive_int(name, gpus)
    if not isinstance(gpus, Iterable):
        raise ConfigError(f"{name} must be a count or a list of GPU ids, got {gpus!r}")
    ids = list(gpus)
    if not ids:
        raise ConfigError(
            f"{spell.given('gpus', [])} selects no GPU; give at least one id, "
            f"or use {spell.hole('procs', 'N')} for CPU"
        )
    for gid in ids:
        if isinstance(gid, bool) or not isinstance(gid, int) or gid < 0:
            raise ConfigError(f"GPU ids must be non-negative whole numbers, got {gid!r}")
    if len(set(ids)) != len(ids):
        raise ConfigError(f"{name} lists a GPU twice: {ids}")
    return tuple(ids)


def _select_gpus(gpus: int | tuple[int, ...], vis: VisibleGpus, spell: Spelling) -> tuple[str, ...]:
    """The ``CUDA_VISIBLE_DEVICES`` tokens of a checked GPU request, if they are visible."""
    if isinstance(gpus, int):
        if gpus > len(vis):
            raise ConfigError(_too_many_gpus(gpus, vis, spell))
        return vis.tokens[:gpus]
    for gid in gpus:
        if gid >= len(vis):
            raise ConfigError(f"GPU id {gid} is not visible: {vis.describe()}")
    return tuple(vis.tokens[i] for i in gpus)


def _too_many_gpus(gpus: int, vis: VisibleGpus, spell: Spelling) -> str:
    asked = f"{spell.given('gpus', gpus)} asked for {gpus} GPUs"
    on_cpu = f"{spell.given('procs', gpus)} to run on CPU"
    if not len(vis):
        return f"{asked} but none is visible ({vis.source}); use {on_cpu}"
    fewer = f"{asked} but {vis.describe()}; use {spell.given('gpus', len(vis))}"
    return f"{fewer}, or {on_cpu}" if spell.cpu_over_gpus else fewer


def _choice(name: str, value: S, spell: Spelling) -> S:
    """``value`` if it is one of option ``name``'s choices (its ``Literal`` type), else
    ConfigError. Typed as the option's type; this checks it at run time."""
    allowed = OPTIONS[name].choices
    if value not in allowed:
        raise ConfigError(
            f"unknown {spell.name(name)} {value!r}; choose one of {', '.join(allowed)}"
        )
    return value


def _lower(value: S) -> S:
    # "BF16" means bf16 (accelerate accepts either case).
    return cast(S, value.lower()) if isinstance(value, str) else value


def _tail(tail: object, spell: Spelling) -> int:
    if isinstance(tail, int) and not isinstance(tail, bool) and tail < 1:
        raise ConfigError(
            f"{spell.given('tail', tail)} shows nothing; use {spell.given('tail', 1)} or more "
            f"({spell.given('output', 'none')} hides)"
        )
    return _positive_int(spell.name("tail"), tail)


def _restarts(value: object, spell: Spelling) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(
            f"{spell.name('max_restarts')} must be a whole number of restarts (0 or more), "
            f"got {value!r}"
        )
    return value


def first_pool(environ: Mapping[str, str]) -> tuple[int, float]:
    """(idle workers, seconds they wait) for a new forkserver to keep before any
    launch has said: as many as a launch with no options starts (every visible
    GPU, else ``DEFAULT_CPU_PROCS``), within ``NBDDP_POOL``; none where the
    settings are wrong (the launch then says what is wrong)."""
    try:
        chosen = settings.read(environ)
    except ConfigError:
        return 0, 0.0
    return min(chosen.pool, len(visible_gpus(environ)) or DEFAULT_CPU_PROCS), chosen.pool_idle


def _master_addr(addr: object, spell: Spelling) -> str:
    if not isinstance(addr, str) or not addr.strip():
        raise ConfigError(
            f"{spell.name('master_addr')} must be a host name or IP address, got {addr!r}"
        )
    return addr.strip()


def _port(port: object, spell: Spelling) -> int | None:
    if port is None:
        return None
    if isinstance(port, str) and port.strip().isdigit():
        port = int(port.strip())
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ConfigError(
            f"{spell.name('port')} must be a number from 1 to 65535 "
            f"(or {spell.unset('port')} for any), got {port!r}"
        )
    return port


def _env(env: Mapping[str, str] | None, spell: Spelling) -> dict[str, str]:
    if env is None:
        return {}
    name = spell.name("env")
    if not isinstance(env, Mapping):
        raise ConfigError(f"{name} must be a dict of strings, got {type(env).__name__}")
    out: dict[str, str] = {}
    for key, value in env.items():
        if not isinstance(key, str) or not key or "=" in key or "\0" in key:
            raise ConfigError(f"{name} keys must be non-empty strings without '=', got {key!r}")
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            raise ConfigError(
                f"{spell.env_entry(key, '...')} must be a string, got {type(value).__name__}"
            )
        if "\0" in str(value):
            raise ConfigError(
                f"{spell.env_entry(key, '...')} contains a NUL byte, which no environment "
                "variable can hold; remove it (pass binary data in a file instead)"
            )
        out[key] = str(value)
    return out


def _positive_float(option: str, value: object, spell: Spelling) -> float | None:
    if value is None:
        return None
    name = spell.name(option)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"{name} must be a number of seconds, got {value!r}")
    if value <= 0:
        raise ConfigError(
            f"{name} must be positive (seconds), got {value}; {spell.unset(option)} for no limit"
        )
    return float(value)


def _non_negative(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ConfigError(f"{name} must be a non-negative number of seconds, got {value!r}")
    return float(value)
