"""Fixtures shared by the unit tests."""

from __future__ import annotations

import pytest

from nbddp.forkserver import pool as pool_module


@pytest.fixture
def killed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The pids the forkserver's pool ends (SIGKILL), recorded and not sent."""
    seen: list[int] = []
    monkeypatch.setattr(pool_module.os, "kill", lambda pid, sig: seen.append(pid))
    return seen
