"""What runs in nbddp's forkserver and in the keepers of ranks.

``server``: the forkserver's loop, which imports torch (never CUDA) and forks
keepers; ``pool``: its keepers and idle workers, kept for the next launch;
``keeper``: the parent of every rank, whatever the start method, so that
nothing a rank starts outlives it. None of it imports the notebook side, and
a rank forked here runs ``nbddp.rank.worker``.
"""
