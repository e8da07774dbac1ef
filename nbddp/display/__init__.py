"""How a run's output is shown.

``model``: the per-rank view model (``RunModel``) that the kernel display
and the panel's feed render, each its own way. ``text``: rank-prefixed
lines, for terminals and scripts. ``kernel``: one block per rank updated in
place in the cell, plus a metrics chart (imports IPython only when it
draws). ``screen``, ``ratelimit``, ``chart`` and ``style`` (state colours)
are their building blocks; ``protocol`` is what a run's display implements.
"""

from nbddp.display.kernel import KernelDisplay
from nbddp.display.text import TextDisplay

__all__ = ["KernelDisplay", "TextDisplay"]
