"""What crosses between processes: the message protocol, the payload, shared memory, to-CPU.
Imported by the notebook, the forkserver and the ranks alike: nothing here imports the notebook
side, IPython or ipywidgets, or initialises CUDA."""
