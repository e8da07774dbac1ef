"""Large answers to ranks' prompts, given as a user would at ``input()``, and what each
should be when it arrives (its length and sha256)."""

from __future__ import annotations

import builtins
import hashlib
import os

import pytest

MB = 1 << 20
SIZES = (MB, 16 * MB, 64 * MB)


def line_of(size: int) -> str:
    """A line of ``size`` characters that no truncation or reordering leaves the same."""
    return os.urandom(size // 2).hex()


def answer_with(monkeypatch: pytest.MonkeyPatch, lines: list[str]) -> None:
    """Answer the ranks' prompts with ``lines``, in order, as the user would at ``input()``."""
    given = iter(lines)
    monkeypatch.setattr(builtins, "input", lambda prompt="": next(given))


def expected(lines: list[str]) -> list[tuple[int, str]]:
    """What each of ``lines`` should be when it arrives: its length and sha256."""
    return [(len(line), hashlib.sha256(line.encode()).hexdigest()) for line in lines]
