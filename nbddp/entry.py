"""The launch entry points: ``launch``, ``Launcher``, ``notebook_launcher``, ``spawn``.

Each validates its options (``LaunchConfig``), checks the call against ``fn``'s signature and
serialises it (``Payload``) before any process starts, then starts a ``Job`` and either waits
(output shown live, rank 0's value returned, a failing rank's error raised) or, with
``block=False``, returns the ``Run`` at once, shown live in the launching cell.
``notebook_launcher`` and ``spawn`` keep accelerate's and torch's signatures: changing the
import is the whole migration.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, ParamSpec, Protocol, TypeVar, cast, overload

from nbddp.display.guard import Guarded
from nbddp.display.kernel import KernelDisplay
from nbddp.display.text import TextDisplay
from nbddp.errors import ConfigError, PayloadError
from nbddp.launcher.clusters import Cluster, configured
from nbddp.launcher.config import LaunchConfig, ViewSpec
from nbddp.launcher.devices import visible_gpus
from nbddp.launcher.failures import by_a_rank, interrupted
from nbddp.launcher.job import Job
from nbddp.launcher.options import (
    DEFAULT_TAIL,
    Backend,
    LaunchOptions,
    MixedPrecision,
    Output,
    StartMethod,
)
from nbddp.launcher.pump import Display
from nbddp.launcher.restarts import Restarting
from nbddp.launcher.run import Run, RunResult
from nbddp.launcher.spelling import Spelling, Worded, check_call, spoken
from nbddp.rank.context import WithRank
from nbddp.wire.payload import LARGE_PAYLOAD_BYTES, Args, Fn, Kwargs, Payload

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from nbddp.cluster.client import ClusterJob

P = ParamSpec("P")
R = TypeVar("R")
log = logging.getLogger(__name__)

NOTEBOOK_LAUNCHER = Spelling(
    names={"gpus": "num_processes", "procs": "num_processes", "port": "use_port"}
)
"""accelerate's names: ``num_processes`` is the GPU count, or CPU processes without GPUs."""
SPAWN = Spelling(names={"procs": "nprocs"})
"""torch.multiprocessing.spawn's names."""


class _Events(Protocol):
    def register(self, event: str, function: Callable[..., object]) -> None: ...


class _Kernel(Protocol):
    def get_parent(self) -> dict[str, object]: ...


class KernelShell(Protocol):
    """What nbddp uses of the kernel's IPython shell."""

    user_ns: dict[str, object]
    events: _Events
    kernel: _Kernel


def kernel_shell() -> KernelShell | None:
    """The IPython shell of the Jupyter kernel this runs in, or None (a terminal IPython, a script).
    Looks only at modules already imported: importing nbddp never imports IPython."""
    ipython = sys.modules.get("IPython")
    if ipython is None or "ipykernel" not in sys.modules:
        return None
    shell = ipython.get_ipython()
    return shell if getattr(shell, "kernel", None) is not None else None


def in_kernel() -> bool:
    """True inside a Jupyter kernel (not a terminal IPython, not a script)."""
    return kernel_shell() is not None


def make_display(view: ViewSpec) -> Guarded:
    """The display of the ranks ``view.output`` shows (all are logged in full): in a kernel a
    block per rank with its last ``view.tail`` lines and a metrics chart, elsewhere text."""
    ranks = view.shown_ranks
    if in_kernel():
        return Guarded(KernelDisplay(live=ranks, tail=view.tail), ranks)
    return Guarded(TextDisplay(ranks=ranks), ranks)


def guarded(display: Display, view: ViewSpec) -> Guarded:
    """``display``, made never to raise: text takes over from it (``display.guard``)."""
    return display if isinstance(display, Guarded) else Guarded(display, view.shown_ranks)


def one_line(call: Callable[P, R]) -> Callable[P, R]:
    """``call``, whose ``ConfigError`` or ``PayloadError`` (raised before any rank starts)
    shows in a kernel as one line, ``ConfigError: ...``, as ``%%ddp``'s do; ``%tb``
    after it shows the whole traceback, and the ``nbddp`` logger has it (debug)."""

    @functools.wraps(call)
    def checked(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return call(*args, **kwargs)
        except (ConfigError, PayloadError) as exc:
            if not hasattr(exc, "_render_traceback_"):  # a rank's own shows its traceback
                log.debug("%s did not start", call.__name__, exc_info=True)
                name = exc.plain.__name__ if isinstance(exc, Worded) else type(exc).__name__
                exc.show_as([f"{name}: {exc}"], once=True)
            raise

    return checked


def start_run(config: LaunchConfig, fn: Fn, args: Args, kwargs: Kwargs) -> Run:
    """Serialise the call, start the job and return its handle; an interrupt while the ranks
    start (``Job.start`` stops those it had started) is raised as one line saying so."""
    try:
        return start_with_display(config, fn, args, kwargs, make_display(config.view))
    except KeyboardInterrupt:
        raise interrupted(None) from None


def waited(run: Run) -> RunResult:
    """``run.wait()``; an interrupt, which stops every rank before it is raised, is
    raised as one line saying so, not a traceback through nbddp's frames."""
    try:
        return run.wait()
    except KeyboardInterrupt as exc:
        if by_a_rank(exc):
            raise
        raise interrupted(run.log_dir) from None


def start_with_display(
    config: LaunchConfig,
    fn: Fn,
    args: Args,
    kwargs: Kwargs,
    display: Display,
) -> Run:
    """``start_run`` with the caller's display (the panel's widgets); a call that cannot bind
    ``fn``'s signature fails here (``check_call``), not as a traceback from every rank."""
    check_call(fn, args, kwargs)
    shown = guarded(display, config.view)
    for notice in config.view.notices:
        shown.notice(spoken(notice))
    shown.starting(config.job.world_size)
    try:
        payload = Payload.serialize(fn, args, kwargs, forked=config.job.start_method == "fork")
        if len(payload.data) > LARGE_PAYLOAD_BYTES:
            shown.notice(
                f"the payload is {len(payload.data) >> 20} MiB of pickled data, copied to "
                "every rank (CPU tensors are shared, not copied); load large data inside "
                "the function instead"
            )
        job: Job | ClusterJob
        if config.cluster is not None:
            from nbddp.cluster.client import ClusterJob  # imports ray: only for cluster runs

            job = ClusterJob(config, payload)
        else:
            job = Job(config.job, payload)
        job.start()
        try:
            if isinstance(job, Job) and config.job.max_restarts:  # refused on a cluster
                return Run(Restarting(job, payload), shown, config)
            return Run(job.core, shown, config)
        except BaseException:  # an interrupt before the run has its handle: its ranks end
            job.core.stop()
            job.core.wait(config.job.kill_grace + 5.0)
            raise
    except BaseException:
        shown.not_started()  # the error says why
        raise


@dataclass(frozen=True, init=False)
class Launcher:
    """Launch options held apart from the call, so ``run`` keeps ``fn``'s exact types.

    ``Launcher(procs=2).run(train, data, epochs=3)`` is ``launch(train, data, epochs=3, procs=2)``
    for type checkers that check ``train``'s parameters. The options may also come as one dict,
    ``Launcher({"procs": 2})``; keywords win over it. (``run`` is generic per call, not the class:
    the options say nothing about ``fn``.)
    """

    options: LaunchOptions

    def __init__(self, options: LaunchOptions | None = None, **more: Unpack[LaunchOptions]) -> None:
        merged: LaunchOptions = {**(options or {}), **more}
        object.__setattr__(self, "options", merged)

    @property
    def output(self) -> Output:
        """Whose output is shown (the ``output`` option)."""
        return self.options.get("output", "all")

    @one_line
    def run(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """Run ``fn(*args, **kwargs)`` on every rank; return rank 0's value."""
        config = LaunchConfig.build(**self.options)
        result = waited(start_run(config, fn, args, kwargs))
        return cast(R, result.values.get(0))


@overload
def launch(fn: Callable[..., R], *args: object, block: Literal[True] = ..., **kwargs: Any) -> R: ...
@overload
def launch(fn: Callable[..., R], *args: object, block: Literal[False], **kwargs: Any) -> Run: ...
@one_line
def launch(
    fn: Callable[..., R],
    *args: object,
    gpus: int | Sequence[int] | None = None,
    procs: int | None = None,
    nodes: int = 1,
    cluster: str | Cluster | None = None,
    start_method: StartMethod = "forkserver",
    master_addr: str = "127.0.0.1",
    port: int | str | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    mixed_precision: MixedPrecision = "no",
    backend: Backend | None = None,
    init_process_group: bool = False,
    max_restarts: int = 0,
    output: Output = "all",
    tail: int = DEFAULT_TAIL,
    debug: bool = False,
    block: bool = True,
    **kwargs: object,
) -> R | Run:
    """Run ``fn(*args, **kwargs)`` on every rank and return rank 0's return value.

    ``gpus``: a count or GPU ids (a process each, nccl); ``procs``: CPU processes
    (gloo), GPUs hidden; neither: every visible GPU, or 2 CPU processes and a notice.
    ``nodes``/``cluster``: that many machines of the Slurm allocation this runs in
    (``"slurm"``) or of a Ray cluster (``"ray://head:10001"``, ``"ray"`` inside one,
    or ``RayCluster``), ``gpus`` or ``procs`` ranks on each.
    ``port``: the rendezvous port (default: a free one); ``env``: extra environment
    variables; ``timeout``: seconds before the run is stopped (stacks dumped first);
    ``mixed_precision``: no, fp16, bf16 or fp8 for ``Accelerator()``;
    ``init_process_group``: initialise the default group first; ``max_restarts``:
    after a failure, restart every rank (``TORCHELASTIC_RESTART_COUNT`` one higher)
    up to N times; ``output``: all, rank0 or none (all is logged); ``tail``: lines
    each rank's block shows; ``debug``: a rank that raises opens pdb on the raising
    frame, in the cell, before the run fails; ``block=False``: return the ``Run`` at once.

    Other keyword arguments go to ``fn`` (bind one named as an option with
    ``functools.partial``); ``Launcher`` keeps ``fn``'s exact static types.
    """
    config = LaunchConfig.build(
        gpus=gpus,
        procs=procs,
        nodes=nodes,
        cluster=cluster,
        start_method=start_method,
        master_addr=master_addr,
        port=port,
        env=env,
        timeout=timeout,
        mixed_precision=mixed_precision,
        backend=backend,
        init_process_group=init_process_group,
        max_restarts=max_restarts,
        output=output,
        tail=tail,
        debug=debug,
    )
    if debug and not block:
        raise ConfigError(
            "debug=True needs block=True: the debugger's prompt opens in the cell that waits"
        )
    run = start_run(config, fn, args, kwargs)
    if not block:
        run.watch()
        return run
    return cast(R, waited(run).values.get(0))


@one_line
def notebook_launcher(
    function: Callable[..., R],
    args: Args = (),
    num_processes: int | None = None,
    mixed_precision: str = "no",
    use_port: str | int = "29500",
    master_addr: str = "127.0.0.1",
    node_rank: int = 0,
    num_nodes: int = 1,
    rdzv_backend: str = "static",
    rdzv_endpoint: str = "",
    rdzv_conf: dict[str, object] | None = None,
    rdzv_id: str = "none",
    max_restarts: int = 0,
    monitor_interval: float = 0.1,
    log_line_prefix_template: str | None = None,
) -> R:
    """accelerate's ``notebook_launcher``, done right: returns rank 0's value.

    Works after the notebook used CUDA (forkserver, not fork); on a machine without GPUs runs
    ``num_processes`` CPU ranks that form one gloo group; picks another port when ``use_port`` is
    busy (and says so); exports ``ACCELERATE_MIXED_PRECISION`` so ``Accelerator()`` sees
    ``mixed_precision``; ``max_restarts`` restarts every rank after a failure, as torch elastic
    does. ``num_nodes`` > 1 runs ``num_processes`` ranks on each of that many nodes of the cluster
    ``NBDDP_CLUSTER`` names (``ConfigError`` when none is configured); ``node_rank`` and ``rdzv_*``
    raise ``ConfigError`` (nbddp places the nodes itself). ``monitor_interval`` and
    ``log_line_prefix_template`` are accepted and unused.
    """
    del monitor_interval, log_line_prefix_template, rdzv_id, rdzv_conf
    if node_rank != 0 or rdzv_endpoint or rdzv_backend != "static":
        raise ConfigError(
            "node_rank and rdzv_* are not used: nbddp places every node itself; pass "
            "num_nodes=N with a cluster in NBDDP_CLUSTER (slurm, or ray://head:10001)"
        )
    cluster = configured() if num_nodes != 1 else None
    if num_nodes != 1 and cluster is None:
        raise ConfigError(
            f"num_nodes={num_nodes} needs a cluster: set NBDDP_CLUSTER=slurm inside a Slurm "
            "allocation, or NBDDP_CLUSTER=ray://head:10001 (or use nbddp.launch(fn, nodes=..., "
            "cluster=...)); run on one machine with num_nodes=1"
        )
    use_gpus = len(visible_gpus()) > 0
    with NOTEBOOK_LAUNCHER.speaking():
        config = LaunchConfig.build(
            gpus=num_processes if use_gpus else None,
            procs=None if use_gpus else num_processes,
            # accelerate's signature takes any string; build checks it is a choice.
            mixed_precision=cast(MixedPrecision, mixed_precision),
            master_addr=master_addr,
            port=use_port,
            port_fallback=True,
            max_restarts=max_restarts,
            nodes=num_nodes,
            cluster=cluster,
        )
        return cast(R, waited(start_run(config, function, tuple(args), {})).values.get(0))


@one_line
def spawn(
    fn: Fn,
    args: Args = (),
    nprocs: int = 1,
    join: bool = True,
    daemon: bool = False,
    start_method: str | None = None,
) -> Run | None:
    """torch.multiprocessing's ``spawn``: ``fn(rank, *args)`` on ``nprocs`` processes.

    As with torch, the ranks see the notebook's devices and choose their own (``cuda:rank``); the
    torch.distributed environment variables are set too. ``start_method`` defaults to nbddp's
    forkserver (torch's default, a fresh interpreter per process, is ``"spawn"``). With
    ``join=False`` returns the ``Run`` (its ``join()`` waits). ``daemon`` is accepted and unused:
    ranks never outlive the notebook anyway.
    """
    del daemon
    with SPAWN.speaking():
        config = LaunchConfig.build(
            procs=nprocs,
            inherit_devices=True,
            # torch's signature takes any string; build checks it is a choice.
            start_method=cast(StartMethod, start_method or "forkserver"),
            host_store=False,
        )
        run = start_run(config, WithRank(fn), tuple(args), {})
    if not join:
        run.watch()
        return run
    waited(run)
    return None
