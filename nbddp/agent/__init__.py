"""What runs on each node of a cluster: the agent, and its runs of nbddp's local launcher.

Placed by an engine (``nbddp.cluster``), reached through its channel; never imports
the notebook's side of a cluster run, its front ends or displays.
"""
