"""What runs in nbddp's forkserver and in ranks' keepers: ``server`` (the loop that imports torch,
never CUDA, and forks keepers), ``pool`` (its keepers and idle workers, kept for the next launch),
``keeper`` (every rank's parent). None of it imports the notebook side."""
