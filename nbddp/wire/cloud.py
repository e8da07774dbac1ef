"""cloudpickle's ``Pickler``, typed as the ``pickle.Pickler`` it is, so that nbddp's picklers
(``shm``, ``payload``) subclass a typed class (cloudpickle ships no type information)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pickle import Pickler as CloudPickler
else:
    from cloudpickle import Pickler as CloudPickler

__all__ = ["CloudPickler"]
