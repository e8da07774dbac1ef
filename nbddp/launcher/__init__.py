"""The notebook's side of a launch: the engine every entry point drives.

Options and their checks, settings, the config, the job that owns the ranks,
the relay that reads them, the starters and the forkserver's link, ports,
devices, logs, the run handle and its result, failures. All of it runs in the
notebook (or a cluster node's agent); nothing here imports the display, the
notebook's front ends or the cluster package.
"""
