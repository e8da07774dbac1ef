"""The docs' own lines, executed: each test here starts processes, and none may be left."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _nothing_left(no_leftovers: None) -> None:
    """Every test here starts processes: none may outlive it (``tests/conftest.py``)."""
