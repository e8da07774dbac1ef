"""cloudpickle's ``Pickler``, typed for subclassing.

cloudpickle ships no type information; its ``Pickler`` is a
``pickle.Pickler`` that pickles functions and classes of ``__main__`` by
value. Type checkers see it as that base class, so that nbddp's picklers
(``shm``, ``tocpu``) subclass a typed class.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pickle import Pickler as CloudPickler
else:
    from cloudpickle import Pickler as CloudPickler

__all__ = ["CloudPickler"]
