"""What runs inside a rank's process: the worker, its channel and context, ``nbddp.log``, the
session loop, and the wrappers a launch puts around the user's function. Nothing here imports the
notebook side, IPython or ipywidgets."""
