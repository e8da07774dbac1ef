"""Rank entry points that use multiprocessing objects passed by the notebook."""

from __future__ import annotations

import os
from typing import Any


def put_rank(rank: int, queue: Any) -> None:
    """``spawn``'s fn: put this rank's number on ``queue``."""
    queue.put(rank * 10)


def set_event_and_add(rank: int, event: Any, value: Any) -> int:
    """``spawn``'s fn: rank 0 sets ``event``; every rank adds 1 to ``value`` under its lock."""
    if rank == 0:
        event.set()
    with value.get_lock():
        value.value += 1
    return rank


def send_on_pipe(rank: int, conn: Any) -> None:
    """``spawn``'s fn: send this rank's number down one end of a pipe."""
    conn.send(rank)


def fail_until_attempt(attempt: int) -> int:
    """Raise on restart counts below ``attempt``; then return the count."""
    count = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    if count < attempt:
        raise ValueError(f"failing on attempt {count}")
    return count


def pid_and_fail_until(attempt: int, queue: Any) -> int:
    """Put (restart count, pid) on ``queue``; fail below ``attempt``."""
    queue.put((int(os.environ["TORCHELASTIC_RESTART_COUNT"]), os.getpid()))
    return fail_until_attempt(attempt)
