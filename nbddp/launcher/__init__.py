"""The notebook's side of a launch: the engine every entry point drives.

It runs in the notebook (or a node's agent); nothing here imports the display,
the notebook's front ends or the cluster package.
"""
