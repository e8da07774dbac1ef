"""Which GPUs the notebook can see, found without initialising CUDA here.

``visible_gpus()`` returns the notebook's GPUs (ordinals after ``CUDA_VISIBLE_DEVICES``), each with
the token that selects it in a child's ``CUDA_VISIBLE_DEVICES``. It never creates a CUDA context in
the notebook (that breaks fork): it reads the driver's list under ``/proc``, unless the notebook
has already initialised CUDA.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

NVIDIA_PROC_DIR = Path("/proc/driver/nvidia/gpus")


@dataclass(frozen=True)
class VisibleGpus:
    """The GPUs the notebook sees. ``tokens[i]`` selects notebook GPU ``i`` in a child."""

    tokens: tuple[str, ...]
    source: str  # what the count was read from, for error messages

    def __len__(self) -> int:
        return len(self.tokens)

    def describe(self) -> str:
        """A short phrase for messages: "2 visible (CUDA_VISIBLE_DEVICES=0,1)"."""
        return f"{len(self.tokens)} visible ({self.source})"


def parse_visible_devices(value: str, physical_count: int) -> tuple[str, ...]:
    """Apply ``CUDA_VISIBLE_DEVICES`` as the CUDA runtime does: up to the first invalid entry."""
    tokens: list[str] = []
    for raw in value.split(","):
        entry = raw.strip()
        if not entry:
            break
        if entry.startswith(("GPU-", "MIG-")):
            tokens.append(entry)
            continue
        try:
            index = int(entry)
        except ValueError:
            break
        if index < 0 or index >= physical_count or str(index) in tokens:
            break
        tokens.append(str(index))
    return tuple(tokens)


def cuda_initialised() -> bool:
    """Whether this process has initialised CUDA (asked without initialising it)."""
    # getattr: torch may be half-imported (nbddp imports it in the background);
    # a torch that is not fully imported cannot have initialised CUDA.
    cuda = getattr(sys.modules.get("torch"), "cuda", None)
    return bool(cuda is not None and cuda.is_initialized())


def visible_gpus(
    environ: Mapping[str, str] | None = None, proc_dir: Path = NVIDIA_PROC_DIR
) -> VisibleGpus:
    """The GPUs this process may use, without initialising CUDA."""
    cvd = (os.environ if environ is None else environ).get("CUDA_VISIBLE_DEVICES")
    if cuda_initialised():
        count = int(sys.modules["torch"].cuda.device_count())
        if cvd is not None:
            tokens = tuple(t.strip() for t in cvd.split(","))[:count]
            return VisibleGpus(tokens, f"CUDA_VISIBLE_DEVICES={cvd}")
        return VisibleGpus(tuple(str(i) for i in range(count)), "torch.cuda")
    try:
        physical = sum(1 for _ in proc_dir.iterdir())
    except OSError:
        physical = 0
    if cvd is None:
        return VisibleGpus(tuple(str(i) for i in range(physical)), f"{physical} in {proc_dir}")
    return VisibleGpus(parse_visible_devices(cvd, physical), f"CUDA_VISIBLE_DEVICES={cvd}")
