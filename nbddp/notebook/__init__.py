"""The notebook front ends: the magics, the ``%%ddp`` cell program and back end, and the panel.

This package itself imports nothing: ranks unpickle ``notebook.cell.CellProgram``.
"""
