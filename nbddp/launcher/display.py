"""``Display``: what a run's display implements (text, kernel blocks, the panel).

``Run`` calls ``attach`` once, then the event methods (cheap: they record) on
the thread that waits, ``refresh`` between batches, ``close`` at the end.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from nbddp.wire.protocol import MetricRow


class Display(Protocol):
    """What ``Run.wait`` feeds."""

    def attach(self, log_dir: Path, world_size: int) -> None:
        """The run's log directory and rank count, before any event."""

    def output(self, rank: int, stream: str, text: str) -> None:
        """A chunk of decoded text ``rank`` wrote to ``stream`` (stdout or stderr)."""

    def notice(self, text: str) -> None:
        """A message from nbddp itself."""

    def state(self, rank: int, state: str) -> None:
        """``rank`` is now running, done, failed or stopped."""

    def metric(self, rank: int, row: MetricRow) -> None:
        """A row ``rank`` sent with ``nbddp.log``."""

    def refresh(self) -> float | None:
        """Draw what is due; return seconds until another call is useful (None: no need)."""

    def close(self) -> None:
        """The run's output is complete: draw everything that is left."""
