"""What a rank has loaded: nbddp's rank side and nothing of the notebook's.

A rank of ``launch()`` (forked from the forkserver, or a fresh interpreter with
``start_method="spawn"``) and a session's cell look at their own ``sys.modules``:
no module of the notebook side (``nbddp.launcher``, ``display``, ``notebook``,
``cluster``, ``entry``), no IPython, ipykernel, ipywidgets or ray. The notebook
that launches them has all of those loaded (this test imports them first), so a
rank that had inherited or imported them would show it. (``fork`` copies the
notebook itself, whatever it has loaded: it is left out.)
"""

from __future__ import annotations

import sys

import pytest

import nbddp
from tests.multiproc.fns import loaded_modules

NOTEBOOK_SIDE = (
    "nbddp.launcher",
    "nbddp.display",
    "nbddp.notebook",
    "nbddp.cluster",
    "nbddp.entry",
)
FRONT_ENDS = ("IPython", "ipykernel", "ipywidgets", "ray")


@pytest.fixture(autouse=True)
def notebook_loaded() -> None:
    """The notebook side and the front ends are loaded here, as in a notebook."""
    import IPython  # noqa: F401
    import ipywidgets  # noqa: F401

    import nbddp.display.kernel
    import nbddp.notebook.magics  # noqa: F401

    assert {"IPython", "ipywidgets", "nbddp.notebook.magics"} <= set(sys.modules)


def only_the_rank_side(mods: list[str]) -> None:
    ours = [m for m in mods if m.startswith("nbddp.")]
    assert "nbddp.rank.worker" in ours  # the listing is the rank's own
    side = [m for m in mods if m.split(".")[0] in FRONT_ENDS or m.startswith(NOTEBOOK_SIDE)]
    assert side == [], side


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_a_launched_rank_has_only_the_rank_side_loaded(method: str) -> None:
    found = nbddp.launch(loaded_modules, procs=2, start_method=method, output="none")
    only_the_rank_side(found)


def test_a_session_cell_rank_has_only_the_rank_side_loaded() -> None:
    with nbddp.session(procs=2, output="none") as session:
        found = session.exec("import sys\nsorted(sys.modules)")  # a %%ddp cell's program
    assert "nbddp.rank.cell" in found and "nbddp.rank.session_loop" in found
    only_the_rank_side(found)
