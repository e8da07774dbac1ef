"""The worker: one rank's process, whatever the start method (``run_forked``).

``run_rank(ctrl)`` waits for one ``RunOrder``, sets the rank up (environment, ``sys.path``, working
directory, context, channel, torch threads, CUDA device, optionally the process group), calls the
function and sends exactly one of ``result`` (``values.pack``), ``error`` or ``exit``; the rank
then exits. Its starter has made it a process group leader and pointed fd 1/2 at the notebook's
pipes. When its link to the notebook reaches EOF, the worker kills its own process group.
"""

from __future__ import annotations

import contextlib
import faulthandler
import io
import logging
import os
import signal
import socket
import sys
import threading
import traceback
from collections.abc import Iterator
from typing import NoReturn

from nbddp import prctl
from nbddp.rank import prompt, session_loop
from nbddp.rank.channel import Channel
from nbddp.rank.channel import install as install_channel
from nbddp.rank.context import install as install_context
from nbddp.rank.errors import error_info, format_stacks, unsendable
from nbddp.rank.regroup import all_arrive
from nbddp.wire import mpobjects, protocol, values
from nbddp.wire.payload import load_call
from nbddp.wire.protocol import Message, RunOrder
from nbddp.wire.stdio import StderrInStdout

log = logging.getLogger(__name__)


def redirect_stdio(out_fd: int, err_fd: int) -> None:
    """Point fd 1/2 at the relay pipes and rebuild ``sys.stdout``/``sys.stderr`` over fd 1
    (``wire.stdio``), line-buffered as on a terminal (``flush()``, which tqdm calls, sends
    partial lines)."""
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    for fd in {out_fd, err_fd} - {1, 2}:
        os.close(fd)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 - lives as long as the process
    sys.stdout = _text_stream(io.FileIO(1, "w", closefd=False))
    sys.stderr = _text_stream(StderrInStdout())  # in the stdout pipe: both keep their order


def _text_stream(raw: io.RawIOBase) -> io.TextIOWrapper:
    return io.TextIOWrapper(
        io.BufferedWriter(raw),
        encoding="utf-8",
        errors="backslashreplace",
        line_buffering=True,
        write_through=True,
    )


def _watch_link(incoming: Iterator[Message], channel: Channel, rank: int) -> None:
    """Block on the link and answer the notebook's requests (stacks, prompts' answers, a
    session's cells); when the notebook is gone, take the whole group down."""
    for kind, body in incoming:
        if kind == "stacks":
            channel.send("stacks", format_stacks(rank))
        elif kind == "answer":
            prompt.answer(body)
        else:
            session_loop.deliver(kind, body)
    # Why SIGKILL to the group: the notebook that would collect our output and
    # stop our children no longer exists; nothing of this rank may outlive it.
    if os.getpgrp() == os.getpid():
        os.killpg(os.getpid(), signal.SIGKILL)
    os._exit(1)


def _apply_order(order: RunOrder) -> None:
    os.environ.clear()
    os.environ.update(order.env)
    sys.path[:] = order.sys_path
    try:
        os.chdir(order.cwd)
    except OSError as exc:
        log.warning("nbddp: could not enter %s: %s", order.cwd, exc)


def _prepare_torch(order: RunOrder) -> None:
    place = order.place
    torch = sys.modules.get("torch")
    if torch is not None and order.threads is not None:
        # torch was imported before this rank's environment was set (forkserver,
        # fork), so apply the thread count it would have read at import.
        torch.set_num_threads(order.threads)
    if place.cuda_index is not None:
        import torch as torch_mod

        torch_mod.cuda.set_device(place.cuda_index)
    if order.init_process_group:
        import torch.distributed as dist

        dist.init_process_group(backend=order.backend, rank=place.rank, world_size=place.world_size)
        # Why wait for every rank's init: a rank that fails at once and exits while another
        # still builds gloo's mesh would break that init ("Connection closed by peer") before
        # the cell's own error. Unbounded: a failed init fails the run, which stops the others.
        all_arrive(dist.distributed_c10d._get_default_store(), "initialised", place.world_size)


def _call(order: RunOrder) -> object:
    _prepare_torch(order)
    call = load_call(order.call)
    try:
        return call.fn(*call.args, **call.kwargs)
    finally:
        mpobjects.flush()  # what it put on a Queue is out before it reports its end


def run_rank(ctrl: socket.socket) -> int:
    """Run the one order received on ``ctrl``; the rank's exit code."""
    prctl.set_name("nbddp-worker")
    # One reader for the link's whole life: what it read beyond the order stays in it.
    incoming = protocol.messages(ctrl)
    kind, order = next(incoming, ("", None))
    if kind != "run" or not isinstance(order, RunOrder):
        return 1  # the notebook went away before sending work
    prctl.set_name(f"nbddp-rank{order.place.rank}")
    _apply_order(order)
    install_context(order.place)
    faulthandler.enable(file=sys.stderr, all_threads=True)
    # The fallback for a rank whose threads hold the GIL (see protocol.STACKS_SIGNAL).
    faulthandler.register(protocol.STACKS_SIGNAL, file=sys.stderr, all_threads=True)
    channel = Channel(ctrl)
    install_channel(channel)
    prompt.install(channel)
    link = (incoming, channel, order.place.rank)
    threading.Thread(target=_watch_link, args=link, name="nbddp-link", daemon=True).start()
    channel.send("started", os.getpid())
    owner = os.getpid()
    try:
        value = _call(order)
    except SystemExit as exc:
        _leave_if_forked(owner, exc)
        if exc.code not in (None, 0):
            return _report_exit(channel, exc.code)
        value = None  # sys.exit() or sys.exit(0): as a function that returned None
    except BaseException as exc:
        _leave_if_forked(owner, exc)
        if order.debug and not isinstance(exc, KeyboardInterrupt):
            prompt.post_mortem(exc.__traceback__)
        # Not printed: the notebook raises it once and adds it to the rank's log (printed,
        # it would show once per failing rank in the cell's output).
        channel.send("error", error_info(exc))
        return 1  # run_forked flushes the output as the rank exits
    _leave_if_forked(owner, None)
    # The process group is not destroyed: as torchrun's workers, the rank exits right after
    # (os._exit), once every rank has returned (_wait_for_peers).
    code = _report_result(channel, value)
    if code == 0:
        _wait_for_peers()
    return code


PEER_WAIT = 3.0  # seconds a returned rank waits for the others before exiting anyway


def _wait_for_peers() -> None:
    """Before a rank that returned exits, wait up to ``PEER_WAIT`` seconds until every rank
    has returned (counted in the default group's store, if it is still initialised)."""
    # Why: exiting closes this rank's gloo/nccl connections while a peer may still be
    # completing its mesh ("connectFullMesh failed ... Connection closed by peer"). Bounded:
    # a peer blocked in a collective this rank skipped must see it leave and fail, not hang.
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return
    # A store hosted by a rank that already left (say) raises: nothing to wait for.
    with contextlib.suppress(Exception):
        store = dist.distributed_c10d._get_default_store()
        all_arrive(store, "returned", dist.get_world_size(), PEER_WAIT)


def _leave_if_forked(owner: int, exc: BaseException | None) -> None:
    """In a child the function forked (``os.fork``) that came back here, exit at once, as a
    forked child reaching its end would (0, its exit code, or 1 and a traceback): it shares
    the rank's link, and what it sent would be taken for the rank's."""
    if os.getpid() == owner:
        return
    code = 0
    if isinstance(exc, SystemExit):
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    elif exc is not None:
        traceback.print_exception(exc, file=sys.stderr)
        code = 1
    prctl.flush_output()
    os._exit(code)


def _report_exit(channel: Channel, code: object) -> int:
    if not isinstance(code, int):
        sys.stderr.write(f"{code}\n")  # as Python's sys.exit(message) prints it
        code = 1
    channel.send("exit", code)
    return code


def _report_result(channel: Channel, value: object) -> int:
    try:
        packed = values.pack(value)
    except Exception as exc:
        channel.send("error", error_info(unsendable("the return value", value, exc)))
        return 1
    channel.send("result", packed)
    del packed  # the shared copies go once the notebook holds their descriptors
    prctl.flush_output()  # before it waits for its peers
    return 0


def run_forked(ctrl: int, out: int, err: int) -> NoReturn:
    """Be the rank in a process its keeper forked (leading its own process group): point fd 1/2
    at ``out``/``err``, run the order on ``ctrl``, exit with its code. Runs as
    ``nbddp.rank.worker`` (never ``__main__``), so ``nbddp.log`` finds the channel it installs."""
    code = 1
    try:
        redirect_stdio(out, err)
        code = run_rank(socket.socket(fileno=ctrl))
    except BaseException:
        traceback.print_exc()
    finally:
        prctl.flush_output()
        # Why os._exit: like multiprocessing's children, a rank does not wait for
        # non-daemon threads the user's code left behind, nor run their atexit hooks.
        os._exit(code)
