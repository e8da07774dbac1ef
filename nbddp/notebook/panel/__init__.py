"""``nbddp.panel``: the ipywidgets panel (settings form, launch and stop, the run's view)."""
