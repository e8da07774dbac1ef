"""How a run's output is shown: each module implements ``launcher.display.Display``.

``model``: the per-rank view model (``RunModel``) that the kernel display
and the panel's feed render, each its own way. ``text``: rank-prefixed
lines, for terminals and scripts. ``kernel``: one block per rank updated in
place in the cell, plus a metrics chart (imports IPython only when it
draws). ``guard``: a display that never raises, falling back to text.
``screen``, ``ratelimit``, ``chart`` (with ``plot``, one metric's panel, and
``axes``, its scales and ticks) and ``style`` (state colours) are their
building blocks. This package itself imports nothing.
"""
