"""The notebook side of a launch.

Options and their validation, the entry points, the run handle, the job that
owns the ranks, the relay that reads them, the starters, ports and devices.
All of it runs in the notebook process, except ``forkserver`` and ``pool``,
which run in nbddp's forkserver process (torch imported, CUDA never
initialised).
"""
