"""How a run's output is shown.

``text``: rank-prefixed lines, for terminals and scripts. ``kernel``: one
block per rank updated in place in the cell, plus a metrics chart (imports
IPython only when it draws). ``screen``, ``ratelimit`` and ``chart`` are
their building blocks.
"""

from nbddp.display.kernel import KernelDisplay
from nbddp.display.text import TextDisplay

__all__ = ["KernelDisplay", "TextDisplay"]
