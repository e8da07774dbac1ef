"""``LaunchConfig``: every launch option, validated before any process starts.

Contract: ``LaunchConfig.build(...)`` either returns a config whose every
field is valid and resolved (world size, GPU tokens, backend, start method)
or raises ``ConfigError`` with a one-line message that says what is wrong
and what to do. Nothing here starts a process, initialises CUDA or binds a
port for longer than a check. The port itself is chosen at launch time
(``ports.choose_port``) because a port free now may be taken by then.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast, get_args

from nbddp.errors import ConfigError
from nbddp.launcher.devices import VisibleGpus, visible_gpus

StartMethod = Literal["forkserver", "spawn", "fork"]
MixedPrecision = Literal["no", "fp16", "bf16", "fp8"]
Backend = Literal["nccl", "gloo"]
DeviceKind = Literal["cuda", "cpu", "inherit"]

DEFAULT_CPU_PROCS = 2


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
    notices: tuple[str, ...] = ()
    """One-line notices for the user about defaults that were chosen."""

    @classmethod
    def build(
        cls,
        *,
        gpus: int | Sequence[int] | None = None,
        procs: int | None = None,
        start_method: str = "forkserver",
        master_addr: str = "127.0.0.1",
        port: int | str | None = None,
        port_fallback: bool = False,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        mixed_precision: str = "no",
        backend: str | None = None,
        init_process_group: bool = False,
        host_store: bool = True,
        inherit_devices: bool = False,
        failure_grace: float = 1.0,
        kill_grace: float = 3.0,
        visible: VisibleGpus | None = None,
    ) -> LaunchConfig:
        """Validate launch options and resolve defaults (see module contract).

        With neither ``gpus`` nor ``procs``: every visible GPU, or with none
        visible, ``DEFAULT_CPU_PROCS`` CPU processes and a notice.
        ``inherit_devices`` (with ``procs``) leaves ``CUDA_VISIBLE_DEVICES``
        as the notebook has it instead of hiding the GPUs.
        """
        notices: list[str] = []
        if gpus is not None and procs is not None:
            raise ConfigError(
                "give either gpus= (one process per GPU) or procs= (CPU processes), not both"
            )
        vis = visible if visible is not None else visible_gpus()
        device: DeviceKind
        tokens: tuple[str, ...] = ()
        if procs is not None:
            world_size = _positive_int("procs", procs)
            device = "inherit" if inherit_devices else "cpu"
        elif gpus is not None:
            tokens = _select_gpus(gpus, vis)
            world_size = len(tokens)
            device = "cuda"
        elif len(vis) > 0:
            tokens = vis.tokens
            world_size = len(tokens)
            device = "cuda"
        else:
            world_size = DEFAULT_CPU_PROCS
            device = "cpu"
            notices.append(
                f"no GPU visible: running {DEFAULT_CPU_PROCS} CPU processes (gloo); "
                "pass procs=N to choose how many"
            )
        start: StartMethod = _choice("start_method", start_method, StartMethod)
        mp: MixedPrecision = _choice(
            "mixed_precision", str(mixed_precision).lower(), MixedPrecision
        )
        chosen_backend: Backend
        if backend is None:
            chosen_backend = "nccl" if device == "cuda" else "gloo"
        else:
            chosen_backend = _choice("backend", backend, Backend)
        if chosen_backend == "nccl" and device == "cpu":
            raise ConfigError("backend 'nccl' needs GPUs; use gpus=N, or backend='gloo' on CPU")
        return cls(
            world_size=world_size,
            device=device,
            gpu_tokens=tokens,
            backend=chosen_backend,
            start_method=start,
            master_addr=_master_addr(master_addr),
            port=_port(port),
            port_fallback=port_fallback,
            env=_env(env),
            timeout=_positive_float("timeout", timeout),
            mixed_precision=mp,
            init_process_group=init_process_group,
            host_store=bool(host_store),
            failure_grace=_non_negative("failure_grace", failure_grace),
            kill_grace=_non_negative("kill_grace", kill_grace),
            notices=tuple(notices),
        )

    def rank_env(self, rank: int, port: int) -> dict[str, str]:
        """The torch.distributed environment of ``rank`` (single node: local == global)."""
        env = {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_WORLD_SIZE": str(self.world_size),
            "GROUP_RANK": "0",
            "NODE_RANK": "0",
            "ROLE_RANK": str(rank),
            "ROLE_WORLD_SIZE": str(self.world_size),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(port),
            "PYTHONUNBUFFERED": "1",
            "ACCELERATE_MIXED_PRECISION": self.mixed_precision,
            "TORCHELASTIC_RUN_ID": "nbddp",
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
            # Like torchrun, avoid N ranks each spawning a thread per core.
            cores = os.cpu_count() or 1
            env["OMP_NUM_THREADS"] = str(max(1, cores // self.world_size))
        env.update(self.env)
        return env


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be a positive whole number, got {value!r}")
    if value < 1:
        raise ConfigError(f"{name} must be at least 1, got {value}")
    return value


def _select_gpus(gpus: int | Sequence[int], vis: VisibleGpus) -> tuple[str, ...]:
    if isinstance(gpus, str):
        raise ConfigError(
            "gpus must be a count or a list of GPU ids such as gpus=[0, 1], "
            f"got the string {gpus!r}"
        )
    if isinstance(gpus, int) and not isinstance(gpus, bool):
        count = _positive_int("gpus", gpus)
        if count > len(vis):
            raise ConfigError(
                f"gpus={count} asked for {count} GPUs but {vis.describe()}; "
                f"use gpus={len(vis)}, or procs={count} to run on CPU"
                if len(vis)
                else f"gpus={count} asked for {count} GPUs but none is visible ({vis.source}); "
                f"use procs={count} to run on CPU"
            )
        return vis.tokens[:count]
    try:
        ids = list(cast(Sequence[int], gpus))
    except TypeError:
        raise ConfigError(f"gpus must be a count or a list of GPU ids, got {gpus!r}") from None
    if not ids:
        raise ConfigError("gpus=[] selects no GPU; give at least one id, or use procs=N for CPU")
    for gid in ids:
        if isinstance(gid, bool) or not isinstance(gid, int) or gid < 0:
            raise ConfigError(f"GPU ids must be non-negative whole numbers, got {gid!r}")
        if gid >= len(vis):
            raise ConfigError(f"GPU id {gid} is not visible: {vis.describe()}")
    if len(set(ids)) != len(ids):
        raise ConfigError(f"gpus lists a GPU twice: {ids}")
    return tuple(vis.tokens[i] for i in ids)


def _choice(name: str, value: object, options: Any) -> Any:
    """``value`` if it is one of the ``Literal`` type ``options``, else ConfigError."""
    allowed: tuple[str, ...] = get_args(options)
    if value not in allowed:
        raise ConfigError(f"unknown {name} {value!r}; choose one of {', '.join(allowed)}")
    return value


def _master_addr(addr: object) -> str:
    if not isinstance(addr, str) or not addr.strip():
        raise ConfigError(f"master_addr must be a host name or IP address, got {addr!r}")
    return addr.strip()


def _port(port: object) -> int | None:
    if port is None:
        return None
    if isinstance(port, str) and port.strip().isdigit():
        port = int(port.strip())
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ConfigError(f"port must be a number from 1 to 65535 (or None for any), got {port!r}")
    return port


def _env(env: Mapping[str, str] | None) -> dict[str, str]:
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise ConfigError(f"env must be a dict of strings, got {type(env).__name__}")
    out: dict[str, str] = {}
    for key, value in env.items():
        if not isinstance(key, str) or not key or "=" in key or "\0" in key:
            raise ConfigError(f"env keys must be non-empty strings without '=', got {key!r}")
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            raise ConfigError(f"env[{key!r}] must be a string, got {type(value).__name__}")
        out[key] = str(value)
    return out


def _positive_float(name: str, value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"{name} must be a number of seconds, got {value!r}")
    if value <= 0:
        raise ConfigError(f"{name} must be positive (seconds), got {value}; use None for no limit")
    return float(value)


def _non_negative(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ConfigError(f"{name} must be a non-negative number of seconds, got {value!r}")
    return float(value)
