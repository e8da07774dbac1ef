"""Real-kernel tests: each one checks that no process is left.

Starting a kernel costs seconds, so ``kernel`` is one kernel for the module: each
test's ranks are still checked for leftovers by the per-test fixture. It first runs
the module's ``KERNEL_SETUP`` cells, if any, each of which must succeed. A module
whose tests end or disturb their kernel overrides ``kernel`` with one of the test's
own. ``notebook`` is one kernel for the module with the extension loaded, for the
tests that leave it as they found it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.kernel.kernel import Kernel, ok


@pytest.fixture(autouse=True)
def _nothing_left(no_leftovers: None) -> None:
    """Every test here starts processes: none may outlive it (``tests/conftest.py``)."""


@pytest.fixture(scope="module")
def kernel(request: pytest.FixtureRequest) -> Iterator[Kernel]:
    """One kernel for the module, that has run the module's ``KERNEL_SETUP`` cells."""
    with Kernel() as k:
        for cell in getattr(request.module, "KERNEL_SETUP", ()):
            ok(k, cell)
        yield k


@pytest.fixture(scope="module")
def notebook() -> Iterator[Kernel]:
    """One kernel, extension loaded, for the tests that leave it as they found it."""
    with Kernel() as kernel:
        ok(kernel, "%load_ext nbddp")
        yield kernel
