"""Where a run's logs go: one directory per run, one ``rank{N}.log`` per rank.

Contract: ``run_base_dir()`` is a per-user directory under the temp dir,
mode 0700, or a fresh private one when that is not ours or is open to
others; ``rank_log(log_dir, rank)`` is the one place that names a rank's
log file.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def run_base_dir() -> Path:
    """Where run directories go: a per-user directory under the temp dir, mode 0700."""
    base = Path(tempfile.gettempdir()) / f"nbddp-{os.getuid()}"
    base.mkdir(mode=0o700, exist_ok=True)
    if base.stat().st_uid != os.getuid() or base.stat().st_mode & 0o077:
        # Someone else made it, or it is open to others: do not write logs there.
        base = Path(tempfile.mkdtemp(prefix="nbddp-"))
    return base


def rank_log(log_dir: Path, rank: int) -> Path:
    """The file that keeps everything ``rank`` wrote."""
    return log_dir / f"rank{rank}.log"
