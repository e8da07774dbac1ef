"""How a run's output is shown: ``text`` for terminals and plain kernels."""

from .text import TextDisplay

__all__ = ["TextDisplay"]
