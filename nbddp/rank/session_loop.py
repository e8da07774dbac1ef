"""A session rank's loop: one process that runs cell after cell and keeps its state.

A session is an ordinary run whose function is ``serve_session_rank``: it answers each
``CellOrder`` with exactly one ``CellReply`` (``cell_done``), in order, in the main thread, and
returns when told to ``end``. Globals live in ``state().space`` (``nbddp.rank.namespace``).
``sys.exit`` in a cell ends the cell, not the rank. ``interrupt`` arrives on the link thread and
raises ``KeyboardInterrupt`` only while that very cell runs, never while idle or replying; a rank
stuck in C is recovered by ``close_group`` then ``regroup`` (``nbddp.rank.regroup``). Each reply
is sent after stdio is flushed, so a cell's output is complete when the notebook reads it.
"""

from __future__ import annotations

import logging
import queue
import signal
import sys
import threading
import types
from dataclasses import dataclass, field

from nbddp import prctl
from nbddp.rank import context, prompt, regroup
from nbddp.rank.channel import installed
from nbddp.rank.errors import error_info, unsendable
from nbddp.rank.namespace import Namespace
from nbddp.wire import mpobjects, values
from nbddp.wire.payload import load_call
from nbddp.wire.protocol import Body, CellOrder, CellReply, ErrorInfo, Message

log = logging.getLogger(__name__)


@dataclass
class SessionState:
    """One session rank's state."""

    space: Namespace = field(default_factory=Namespace)
    """The globals every call runs in, and the names in it that are the ranks'."""
    running: int | None = None
    """The cell whose code runs now (main thread only)."""
    interrupt_for: int | None = None
    """The cell an interrupt was asked for (written by the link thread)."""
    last_failure: types.TracebackType | None = None
    """Where the last cell raised, kept until the next cell for ``DebugLast``."""


_STATE: SessionState | None = None
_INBOX: queue.SimpleQueue[Message] = queue.SimpleQueue()
_MAIN: int | None = None  # the main thread's ident while serving


def state() -> SessionState:
    """This rank's session state; ``RuntimeError`` outside a session rank."""
    if _STATE is None:
        raise RuntimeError("not inside an nbddp session rank")
    return _STATE


def deliver(kind: str, body: Body) -> None:
    """Take a request the link thread received (one that is not a session's is dropped)."""
    if kind == "interrupt":
        current = _STATE
        if current is not None and _MAIN is not None:
            current.interrupt_for = int(body)
            _nudge(current, int(body), NUDGES)
        return
    if kind == "close_group":
        regroup.shut_accepted()  # here: a rank blocked in a collective holds the main thread
    if kind in ("cell", "end", "close_group", "regroup"):
        _INBOX.put((kind, body))


NUDGES = 40  # times an interrupt's signal is sent, a quarter of a second apart, until taken


def _nudge(current: SessionState, cell: int, left: int) -> None:
    # Again until taken: a signal landing just before the main thread blocks waits for the next.
    if _MAIN is None or current.interrupt_for != cell or current.running not in (cell, None):
        return
    signal.pthread_kill(_MAIN, signal.SIGINT)
    if left > 1:  # (a rank ends with os._exit: a pending timer holds nothing up)
        threading.Timer(0.25, _nudge, (current, cell, left - 1)).start()


def _on_sigint(signum: int, frame: types.FrameType | None) -> None:
    current = _STATE
    running = current.running if current is not None else None
    if current is not None and running is not None and current.interrupt_for == running:
        current.interrupt_for = None
        raise KeyboardInterrupt
    # Idle, replying, or an interrupt meant for an earlier cell: nothing to stop.


_BACKEND: str | None = None  # the session's backend, read once its group exists


def serve_session_rank() -> None:
    """Answer cells until told to end; the function of a session's run."""
    global _STATE, _MAIN, _BACKEND
    _STATE = SessionState()
    _MAIN = threading.get_ident()
    signal.signal(signal.SIGINT, _on_sigint)
    # Why: a rank inherits its signal mask; one started on a Ray node comes from a
    # worker thread that blocks SIGINT, and an interrupt would then never arrive.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    channel = installed()
    assert channel is not None, "runs in a rank, after the worker installed its channel"
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        _BACKEND = str(dist.get_backend())
        # A cell may destroy the group and init another: each later rendezvous gets a
        # prefix of its own, so no rank reads a key the previous group left in the store.
        regroup.fresh_rendezvous()
    channel.send("cell_done", CellReply(0, values.pack(None), None, ()))  # ready
    while True:
        kind, body = _INBOX.get()
        if kind == "cell":
            channel.send("cell_done", _run(_STATE, body))
        elif kind == "close_group":
            try:
                regroup.close_group()
            except Exception as exc:  # the regroup that follows reports what is wrong
                log.warning("nbddp: closing the process group failed: %s", exc)
        elif kind == "regroup":
            channel.send("regrouped", _regroup(int(body)))
        else:
            return


def _regroup(number: int) -> ErrorInfo | None:
    """A new default process group (``regroup``); what it raised, or None."""
    place = context.require()
    try:
        import torch.distributed as dist

        backend = _BACKEND or str(dist.get_backend())
        regroup.regroup(number, backend, place.rank, place.world_size)
    except Exception as exc:
        return error_info(exc)
    return None


def _run(current: SessionState, order: CellOrder) -> CellReply:
    """Run one cell's call; the reply says what came of it."""
    value: object = None
    error: ErrorInfo | None = None
    try:
        call = load_call(order.call)
        current.running = order.cell
        try:
            # An interrupt that came before the cell began (its signal found no
            # cell running) is taken now: the notebook has asked for it.
            if current.interrupt_for == order.cell:
                current.interrupt_for = None
                raise KeyboardInterrupt
            if not isinstance(call.fn, DebugLast):
                current.last_failure = None
            try:
                value = current.space.run(call.fn, call.args, call.kwargs)
            except prompt.PromptInterrupted:
                raise KeyboardInterrupt from None
            except BaseException as exc:
                # As in a run (``worker``): nothing to debug in an interrupt or sys.exit.
                if order.debug and not isinstance(exc, KeyboardInterrupt | SystemExit):
                    prompt.post_mortem(exc.__traceback__)
                current.last_failure = exc.__traceback__
                raise
        finally:
            current.running = None
            mpobjects.flush()
    except BaseException as exc:  # the cell's own failure: the rank stays
        error = error_info(exc)
    packed = None
    if error is None:
        try:
            packed = values.pack(value)
        except Exception as exc:
            error = error_info(unsendable("the value", value, exc))
    prctl.flush_output()
    owned = tuple(sorted(current.space.owned))
    return CellReply(order.cell, packed, error, owned, _device_bytes())


@dataclass(frozen=True)
class DebugLast:
    """A cell that opens pdb where the last cell raised, on ``rank`` (``%ddp_debug``);
    the other ranks return at once, and the failure is kept for another look."""

    rank: int

    def __call__(self) -> bool:
        """True on the rank that had a failure to show."""
        if context.require().rank != self.rank:
            return False
        failure = state().last_failure
        if failure is None:
            return False
        try:
            prompt.post_mortem(failure)
        except prompt.PromptInterrupted:
            raise KeyboardInterrupt from None
        return True


def _device_bytes() -> int | None:
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    try:
        return int(torch.cuda.memory_reserved())
    except Exception:
        return None
