"""One way from a rank's values to the notebook: every tensor on the CPU.

``cpu_reduction(obj)``, in a pickler's ``reducer_override`` (``values.pack``'s), pickles every
tensor not on the CPU, wherever it sits, as a CPU copy that keeps what pickling a CPU tensor keeps
(``Parameter``, subclass, attributes, a leaf's ``requires_grad``); a tensor reached twice is
copied once. The rank's own values are untouched. Non-goals: views of one CUDA storage come back
separate; meta stays meta.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from _pickle import _ReducedType

    import torch

_STAY = frozenset(("cpu", "meta"))  # device types pickled as they are


def cpu_reduction(obj: object, shared_from: int) -> _ReducedType | None:
    """How a pickler's ``reducer_override`` sends ``obj`` when it is a tensor to copy
    to the CPU; None for anything else. ``shared_from``: plain tensors of at least
    that many bytes are copied straight into shared memory (``on_cpu``)."""
    # Only a fully imported torch: nbddp may be importing it in the background,
    # and no tensor can exist before that import has finished.
    tensor_type = getattr(sys.modules.get("torch"), "Tensor", None)
    if tensor_type is not None and isinstance(obj, tensor_type) and obj.device.type not in _STAY:
        # Pickled as "the CPU copy itself": the copy goes through the
        # pickler again (it is on the CPU now) and through the memo, so the
        # original reached twice is copied once.
        return _same, (on_cpu(obj, shared=obj.nbytes >= shared_from),)
    return None


def on_cpu(tensor: torch.Tensor, *, shared: bool = False) -> torch.Tensor:
    """A CPU copy of ``tensor`` keeping its kind, subclass and attributes; ``shared``: a
    plain tensor or ``Parameter`` goes straight into shared memory (one copy, not two)."""
    import torch  # already imported: there is a tensor

    with torch.no_grad():  # a copy outside any autograd graph, as ``detach()`` gives
        if shared and type(tensor) in (torch.Tensor, torch.nn.Parameter):
            # Straight into a fresh, contiguous shared-memory tensor on the CPU.
            storage = torch.UntypedStorage._new_using_fd_cpu(tensor.nbytes)
            moved = torch.empty(0, dtype=tensor.dtype).set_(storage).view(tensor.size())
            # Pages touched first: a device-to-host copy faults untouched ones in singly.
            moved.zero_().copy_(tensor.detach())
        else:
            moved = tensor.cpu()
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


def _same(value: object) -> object:
    return value
