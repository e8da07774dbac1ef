"""What runs inside a rank's process: the worker, its channel, ``nbddp.log``.

Nothing here imports the notebook side, IPython or ipywidgets.
"""
