"""One way from a rank's values to the notebook: pickled with every tensor on the CPU.

Contract: ``dumps(value)`` is ``cloudpickle.dumps(value)``, except that every
tensor not on the CPU, wherever it sits (dicts and ``OrderedDict``s such as a
``state_dict()``, lists, tuples, namedtuples, dataclasses, any object's
attributes, an exception's arguments), is pickled as a copy on the CPU, so
that the notebook can load it without a GPU or CUDA. The copy keeps what
pickling a CPU tensor keeps: ``nn.Parameter`` stays a ``Parameter`` (with
its ``requires_grad``), a tensor subclass keeps its type when its ``cpu()``
does (the default ``__torch_function__`` does), attributes set on a tensor
stay, a leaf tensor keeps ``requires_grad`` (a tensor in an autograd graph
comes back detached). The same tensor reached twice is copied once and
comes back as one object. The rank's own values are left as they are.

Used for the exceptions of failing ranks; return values and ``--out``
values go through ``values.pack``, which makes the same CPU copies
(``cpu_reduction``), large ones straight into shared memory.

Non-goals: views of one CUDA storage come back as separate tensors (each
view is copied on its own); meta tensors stay meta (they hold no data).
"""

from __future__ import annotations

import io
import pickle
import sys
from types import ModuleType
from typing import TYPE_CHECKING

from nbddp.wire.cloud import CloudPickler

if TYPE_CHECKING:
    from _pickle import _ReducedType

    import torch

_STAY = frozenset(("cpu", "meta"))  # device types pickled as they are


def dumps(value: object) -> bytes:
    """``value`` pickled with cloudpickle, every tensor copied to the CPU (see module doc)."""
    buffer = io.BytesIO()
    CpuPickler(buffer).dump(value)
    return buffer.getvalue()


class CpuPickler(CloudPickler):
    """cloudpickle, with every non-CPU tensor pickled as its copy on the CPU."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)

    def reducer_override(self, obj: object) -> _ReducedType:
        reduced = cpu_reduction(obj)
        return reduced if reduced is not None else super().reducer_override(obj)


def cpu_reduction(obj: object, shared_from: int | None = None) -> _ReducedType | None:
    """How a pickler's ``reducer_override`` sends ``obj`` when it is a tensor to copy
    to the CPU; None for anything else. ``shared_from``: plain tensors of at least
    that many bytes are copied straight into shared memory (``on_cpu``)."""
    torch = _torch()
    if torch is not None and isinstance(obj, torch.Tensor) and obj.device.type not in _STAY:
        # Pickled as "the CPU copy itself": the copy goes through the
        # pickler again (it is on the CPU now) and through the memo, so the
        # original reached twice is copied once.
        shared = shared_from is not None and obj.nbytes >= shared_from
        return _same, (on_cpu(obj, shared=shared),)
    return None


def on_cpu(tensor: torch.Tensor, *, shared: bool = False) -> torch.Tensor:
    """A CPU copy of ``tensor`` keeping its kind, subclass and attributes (see module
    doc); ``shared``: a plain tensor or ``Parameter`` is copied into shared memory
    (one copy, where ``cpu()`` and then sharing would make two)."""
    import torch  # already imported: there is a tensor

    with torch.no_grad():  # a copy outside any autograd graph, as ``detach()`` gives
        moved: torch.Tensor = (
            _shared_copy(tensor)
            if shared and type(tensor) in (torch.Tensor, torch.nn.Parameter)
            else tensor.cpu()
        )
    if moved.device.type != "cpu":  # would be pickled (and copied) again, endlessly
        raise TypeError(
            f"{type(tensor).__name__}.cpu() returned a tensor on {moved.device}; "
            "send a plain tensor instead"
        )
    if isinstance(tensor, torch.nn.Parameter):
        # Parameter switches ``__torch_function__`` off: ``cpu()`` gave a plain tensor.
        moved = torch.nn.Parameter(moved, requires_grad=tensor.requires_grad)
    elif tensor.requires_grad and tensor.is_leaf:
        moved.requires_grad_(True)
    state = getattr(tensor, "__dict__", None)
    if state:
        moved.__dict__.update(state)
    return moved


def _shared_copy(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` copied into a fresh, contiguous shared-memory tensor on the CPU."""
    import torch

    storage = torch.UntypedStorage._new_using_fd_cpu(tensor.nbytes)
    out = torch.empty(0, dtype=tensor.dtype).set_(storage).view(tensor.size())
    out.copy_(tensor.detach())
    return out


def _torch() -> ModuleType | None:
    # Only a fully imported torch: nbddp may be importing it in the background,
    # and no tensor can exist before that import has finished.
    torch = sys.modules.get("torch")
    return torch if hasattr(torch, "Tensor") else None


def _same(value: object) -> object:
    return value
