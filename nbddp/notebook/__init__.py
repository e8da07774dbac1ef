"""The notebook's front ends: the magics, the ``%%ddp`` back end, sessions and the panel.

``program`` turns a cell into the ``nbddp.rank.cell.CellProgram`` the ranks
run. This package itself imports nothing.
"""
