"""Tensors whose values are known while tracing: inputs a graph holds fixed (an image's patch grid) that the model's
code still uses as tensors.

A vision tower that decides shapes from an integer input (Qwen2-VL's ``image_grid_thw``: how many patches each image
has, where each attention window starts) cannot export it as data: torch.export stops at the first ``tolist()``. Held at
the sample's values as a Python list, the code fails where it calls tensor methods on it (``grid.prod(-1)``). Inside
:class:`KnownValues`, the held values are real tensors: what the code computes from them alone runs eagerly (its
results are known too, so ``tolist()`` and ``item()`` give numbers), and where a known tensor meets a traced one it
enters the graph as a constant.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import _disable_current_modes


class KnownValues(TorchFunctionMode):
    """``with KnownValues() as known: model(..., grid=known.tensor(values))`` (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self._known: dict[int, torch.Tensor] = {}  # by id: the tensors themselves keep their ids unique while held

    def tensor(self, value: torch.Tensor) -> torch.Tensor:
        """A known copy of ``value`` (a real tensor, whatever tracing is under way)."""
        with _disable_current_modes(), torch._C.DisableTorchFunction():
            known = value.detach().clone()
        self._known[id(known)] = known
        return known

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        tensors = [x for x in pytree.tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
        if tensors and all(id(t) in self._known for t in tensors):
            with _disable_current_modes(), torch._C.DisableTorchFunction():
                out = func(*args, **kwargs)
            for result in pytree.tree_leaves(out):
                if isinstance(result, torch.Tensor):
                    self._known[id(result)] = result
            return out
        if any(id(t) in self._known for t in tensors):
            args, kwargs = pytree.tree_map_only(torch.Tensor, self._constant, (args, kwargs))
        return func(*args, **kwargs)

    def _constant(self, value: torch.Tensor) -> torch.Tensor:
        """A known tensor as a constant of the graph under way (any other tensor as it is)."""
        if id(value) not in self._known:
            return value
        with _disable_current_modes(), torch._C.DisableTorchFunction():
            values, dtype = value.tolist(), value.dtype
        return torch.tensor(values, dtype=dtype)
