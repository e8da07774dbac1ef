"""Displays for tests: one that ignores every event (override what a test reacts to),
ones that keep the notices, or the output and notices, and one that records every
event in order."""

from __future__ import annotations

from pathlib import Path
from typing import Any


class QuietDisplay:
    """Implements ``nbddp.launcher.pump.Display`` doing nothing; override ``output``."""

    def attach(self, log_dir: Path, world_size: int) -> None: ...
    def output(self, rank: int, stream: str, text: str) -> None: ...
    def notice(self, text: str) -> None: ...
    def state(self, rank: int, state: str) -> None: ...
    def metric(self, rank: int, row: dict[str, Any]) -> None: ...
    def refresh(self) -> float | None:
        return None

    def close(self) -> None: ...


class Notices(QuietDisplay):
    """Keeps the notices shown."""

    def __init__(self) -> None:
        self.notices: list[str] = []

    def notice(self, text: str) -> None:
        self.notices.append(text)


class Recorder(Notices):
    """Keeps every output chunk and notice, in arrival order."""

    def __init__(self) -> None:
        super().__init__()
        self.chunks: list[tuple[int, str]] = []

    def output(self, rank: int, stream: str, text: str) -> None:
        self.chunks.append((rank, text))


class RecordingDisplay:
    """Records every event as a tuple, in order (``events``), what it was attached to,
    how often it was refreshed (asking for the next refresh in 0.1 s) and whether it
    was closed."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.refreshes = 0
        self.closed = False
        self.attached: tuple[Path, int] | None = None

    def attach(self, log_dir: Path, world_size: int) -> None:
        self.attached = (log_dir, world_size)

    def output(self, rank: int, stream: str, text: str) -> None:
        self.events.append(("output", rank, stream, text))

    def notice(self, text: str) -> None:
        self.events.append(("notice", text))

    def state(self, rank: int, state: str) -> None:
        self.events.append(("state", rank, state))

    def metric(self, rank: int, row: dict[str, Any]) -> None:
        self.events.append(("metric", rank, row))

    def refresh(self) -> float | None:
        self.refreshes += 1
        return 0.1

    def close(self) -> None:
        self.closed = True
