"""``nbddp.panel``: the ipywidgets panel that configures, launches, stops and watches runs.

``settings`` (the form as data: validation, the equivalent code) and
``feed`` (the run's display) import no widgets and are unit-tested alone;
``view`` builds the widgets; ``panel`` wires them to runs; ``cells`` shows
a panel in the kernel and closes it when its cell runs again or is deleted.
Nothing here is imported by ``import nbddp``: ipywidgets loads on first use.
"""
