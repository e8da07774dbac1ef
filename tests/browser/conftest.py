"""Browser-test fixtures: one JupyterLab server and one Chromium for the module."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.browser.lab import Lab, artifacts_dir, browser, lab


@pytest.fixture(scope="module")
def lab_server() -> Iterator[Lab]:
    with lab() as server:
        yield server


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    with browser() as b:
        yield b


def pytest_terminal_summary(terminalreporter: Any) -> None:
    shots = sorted(artifacts_dir().glob("*.png"))
    if shots:
        terminalreporter.write_line(f"browser screenshots ({len(shots)}): {artifacts_dir()}")


@pytest.fixture
def viewport() -> dict[str, int]:
    """The page's size; a module whose screenshots need another overrides it."""
    return {"width": 1280, "height": 1100}


@pytest.fixture
def page(chromium: Any, viewport: dict[str, int]) -> Iterator[Any]:
    """A page of its own for the test, in a browser context closed after it."""
    context = chromium.new_context(viewport=viewport)
    page = context.new_page()
    yield page
    context.close()


@pytest.fixture(autouse=True)
def _nothing_left(no_leftovers: None) -> None:
    """Every test here starts processes: none may outlive it (``tests/conftest.py``)."""
