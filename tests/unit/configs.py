"""Launch configurations for unit tests, built the way an entry point builds them
but with no GPU visible unless a test says which (``visible``)."""

from __future__ import annotations

from nbddp.launcher.config import LaunchConfig
from nbddp.launcher.devices import VisibleGpus
from nbddp.launcher.spelling import KEYWORDS, Spelling

NO_GPU = VisibleGpus((), "none in a test")


def build(spelling: Spelling = KEYWORDS, **kw: object) -> LaunchConfig:
    """``LaunchConfig.build`` as the entry point that spells options ``spelling`` calls it."""
    kw.setdefault("visible", NO_GPU)
    with spelling.speaking():
        return LaunchConfig.build(**kw)  # type: ignore[arg-type]
