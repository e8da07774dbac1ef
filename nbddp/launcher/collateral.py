"""What became of a rank that failed only because another did, in plain words.

``collateral(outcome, cause)`` says why a rank failed or was stopped only
because the root cause's rank failed, or None; ``broken_link(error)`` says
whether an error is a process group's connection broken by a peer, in one
line; ``plain(message)`` makes any error message one plain line. All are pure
over the job's typed values; the backend's own text stays in the rank's log.
"""

from __future__ import annotations

import re

from nbddp.launcher.events import Failure, RankOutcome, RankState
from nbddp.wire.protocol import ErrorInfo


def collateral(outcome: RankOutcome, cause: Failure | None) -> str | None:
    """Why ``outcome``'s rank failed only because ``cause``'s did (``stopped after rank 1
    failed``): stopped or interrupted by nbddp, or its link to a peer broke; else None."""
    if cause is None or outcome.rank == cause.rank:
        return None
    after = f"after rank {cause.rank} failed"
    if outcome.state is RankState.STOPPED:
        return f"stopped {after}"
    error = outcome.error
    if outcome.state is not RankState.FAILED or error is None:
        return None
    if error.type_name == "builtins.KeyboardInterrupt":
        return f"stopped {after}"
    link = broken_link(error)
    if link is None:
        return None
    where = "in a collective " if link.partition(":")[0] in _COLLECTIVES else ""
    return f"stopped {where}{after} ({link})"


_COLLECTIVES = ("gloo", "nccl")
_BROKEN = (
    ("connection closed by peer", re.compile(r"connection closed by peer", re.I)),
    ("connection reset by peer", re.compile(r"connection reset by peer", re.I)),
    ("broken pipe", re.compile(r"broken pipe", re.I)),
    ("a peer closed the connection", re.compile(r"pair closure|socket closed", re.I)),
    ("a remote process exited", re.compile(r"remote process exited|ncclRemoteError", re.I)),
    ("communicator aborted", re.compile(r"communicator was aborted|NCCL.*abort", re.I)),
    ("could not connect to the other ranks", re.compile(r"connectFullMesh failed", re.I)),
    ("the store closed the connection", re.compile(r"failed to recv, got 0 bytes", re.I)),
)
"""What a peer's end does to a rank's process group or store: the plain words, and
the backend's own wording of it."""


def broken_link(error: ErrorInfo | None) -> str | None:
    """``gloo: connection closed by peer`` for a process group's or store's error when a
    peer is gone; None for any other (a user's own ``ConnectionResetError`` included)."""
    if error is None:
        return None
    text = error.message
    lowered = text.lower()
    if "gloo" in lowered:
        backend = "gloo"
    elif "nccl" in lowered:
        backend = "nccl"
    elif error.type_name.startswith("torch."):
        backend = "store" if "store" in lowered or "Store" in error.type_name else "torch"
    else:
        return None
    words = next((words for words, pattern in _BROKEN if pattern.search(text)), None)
    return f"{backend}: {words}" if words is not None else None


_SOURCE_PLACE = re.compile(r"\[[^\]\s]*/[^\]\s]*:\d+\]\s*")
"""``[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553]``"""
_NOT_PLAIN = re.compile(r"[^\x20-\x7e\u00a0-\u024f\u2010-\u2027]+")
"""What a line of text may not hold: controls, emoji and other symbols (letters of
Latin scripts and common punctuation stay)."""
_CHATTER = re.compile(r"\s*(GLHF!?|This is typically caused by[^.]*\.|Check the logs of[^.]*\.)")


def plain(message: str, limit: int = 160) -> str:
    """``message``'s first line without source places, emoji or sign-off, cut to ``limit``."""
    first = next((line for line in message.splitlines() if line.strip()), "")
    text = _CHATTER.sub("", _SOURCE_PLACE.sub("", first))
    text = " ".join(_NOT_PLAIN.sub(" ", text).split())
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."
