"""A display for tests that only need to react to output: every other event is ignored."""

from __future__ import annotations

from pathlib import Path
from typing import Any


class QuietDisplay:
    """Implements ``nbddp.launcher.display.Display`` doing nothing; override ``output``."""

    def attach(self, log_dir: Path, world_size: int) -> None: ...
    def output(self, rank: int, stream: str, text: str) -> None: ...
    def notice(self, text: str) -> None: ...
    def state(self, rank: int, state: str) -> None: ...
    def metric(self, rank: int, row: dict[str, Any]) -> None: ...
    def refresh(self) -> float | None:
        return None

    def close(self) -> None: ...
