"""Functions that prompt tests run in the ranks (imported there by reference)."""

from __future__ import annotations

import getpass
import os
import sys
import threading
import time


def _rank() -> int:
    return int(os.environ["RANK"])


def ask_from_threads(count: int) -> dict[str, str]:
    """On rank 1, ``count`` threads call ``input()`` at once; what each read."""
    got: dict[str, str] = {}
    if _rank() != 1:
        return got

    def ask(name: str) -> None:
        got[name] = input(f"{name}? ")

    threads = [threading.Thread(target=ask, args=(f"t{i}",)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return got


def secret() -> str | None:
    """Rank 1's ``getpass.getpass()``."""
    return getpass.getpass() if _rank() == 1 else None


def read_a_line() -> str | None:
    """Rank 1's ``input()``."""
    return input("who? ") if _rank() == 1 else None


def stop_at_a_breakpoint() -> None:
    """Rank 1 stops at ``breakpoint()``."""
    if _rank() == 1:
        breakpoint()


def exit_with(code: int) -> None:
    """Rank 1 calls ``sys.exit(code)``."""
    if _rank() == 1:
        sys.exit(code)


def raise_keyboard_interrupt() -> None:
    """Rank 1 raises a ``KeyboardInterrupt`` of its own."""
    if _rank() == 1:
        raise KeyboardInterrupt("kbd-in-rank")


def fail() -> None:
    """Rank 1 raises ``ValueError``."""
    if _rank() == 1:
        raise ValueError("bad batch")


def ask_then_return() -> int:
    """Rank 1 asks for a line; rank 0 returns at once (and waits for its peers)."""
    import torch.distributed as dist

    if dist.get_rank() == 1:
        input("go? ")
    return dist.get_rank()


def ask_or_fail(flag: str) -> None:
    """Rank 0 asks for a line; rank 1 raises once ``flag`` exists."""
    import torch.distributed as dist

    if dist.get_rank() == 0:
        input("name? ")
        return
    while not os.path.exists(flag):
        time.sleep(0.01)
    raise ValueError("rank 1 failed while rank 0 was asked")
