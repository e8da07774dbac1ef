"""How a run's output is shown; each display implements ``launcher.pump.Display``.

``model``: the per-rank view model the kernel display and the panel render; ``text``:
rank-prefixed lines; ``kernel``: per-rank blocks updated in place in the cell, and a chart;
``guard``: a display that never raises. The rest are their building blocks. Imports nothing.
"""
