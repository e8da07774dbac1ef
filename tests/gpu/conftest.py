"""The GPU suite runs where CUDA GPUs are visible and is skipped everywhere else.

The count is asked of torch in a child process: asking it here would
initialise CUDA in the test process, which some tests must control (a
notebook that has, or has not, touched CUDA before it launches).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

COUNT = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"


def _gpu_count() -> int:
    if not any(os.path.exists(p) for p in ("/dev/nvidiactl", "/proc/driver/nvidia/gpus")):
        return 0  # no NVIDIA driver: skip without paying for a torch import
    done = subprocess.run(
        [sys.executable, "-c", COUNT], capture_output=True, text=True, timeout=300, check=False
    )
    return int(done.stdout.strip() or 0) if done.returncode == 0 else 0


GPUS = _gpu_count()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if GPUS:
        return
    skip = pytest.mark.skip(reason="no CUDA GPU visible")
    for item in items:
        if "/gpu/" in str(item.path):
            item.add_marker(skip)


@pytest.fixture
def gpus() -> int:
    """How many GPUs this process sees (at least one: the suite is skipped otherwise)."""
    return GPUS


@pytest.fixture(autouse=True)
def _nothing_left(no_leftovers: None) -> None:
    """Every test here starts processes: none may outlive it (``tests/conftest.py``)."""
