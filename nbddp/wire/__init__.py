"""What crosses between processes.

The message protocol, the payload, shared memory, moving tensors to the CPU.
Imported by the notebook, the forkserver and the ranks alike: nothing here
imports the notebook side, IPython or ipywidgets, or initialises CUDA.
"""
