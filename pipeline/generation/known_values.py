"""Tensors whose values are known while tracing: inputs a graph holds fixed (an image's patch grid) that the model's
code still uses as tensors.

A vision tower that decides shapes from an integer input (Qwen2-VL's ``image_grid_thw``: how many patches each image
has, where each attention window starts) cannot export it as data: torch.export stops at the first ``tolist()``. Held at
the sample's values as a Python list, the code fails where it calls tensor methods on it (``grid.prod(-1)``). Inside
:class:`KnownValues`, the held values are real tensors: what the code computes from them alone runs eagerly (its
results are known too, so ``tolist()`` and ``item()`` give numbers), and where a known tensor meets a traced one it
enters the graph as a constant.

Handed the selections that keep every element on the sample (:mod:`pipeline.generation.kept_selections`), each such
mask is known, all true, from the call that makes it, and the selection by it is the identity: the graph takes no
``NonZero`` for it. The masks the model computed stay in :attr:`KnownValues.masks` (the graph can tell from them
whether the input kept every element). A selection by a mask computed from held inputs alone takes its rows by
constant indices: a size the graph knows.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import _disable_current_modes

from converters.errors import ExportError
from pipeline.generation.kept_selections import BooleanMakers, KeptSelection, selecting_mask


class KnownValues(TorchFunctionMode):
    """``with KnownValues() as known: model(..., grid=known.tensor(values))`` (see the module docstring);
    ``KnownValues(kept)`` with the selections that keep every element on the sample."""

    def __init__(self, kept: tuple[KeptSelection, ...] = ()) -> None:
        super().__init__()
        self._known: dict[int, torch.Tensor] = {}  # by id: the tensors themselves keep their ids unique while held
        self._kept = {selection.maker: selection for selection in kept}
        self._makers = BooleanMakers()
        self._whole: set[int] = set()  # ids of the known masks of kept selections
        #: the masks the model computed for the kept selections (traced: the data's), in the order it made them
        self.masks: list[torch.Tensor] = []

    def tensor(self, value: torch.Tensor) -> torch.Tensor:
        """A known copy of ``value`` (a real tensor, whatever tracing is under way)."""
        with _disable_current_modes(), torch._C.DisableTorchFunction():
            known = value.detach().clone()
        self._known[id(known)] = known
        return known

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        mask = selecting_mask(func, args)
        if mask is not None and id(mask) in self._whole and id(args[0]) not in self._known:
            return self._kept_mask(func, self._identity(args[0], mask))
        if mask is not None and id(mask) in self._known and id(args[0]) not in self._known:
            return self._kept_mask(func, self._selected(args[0], mask))
        tensors = [x for x in pytree.tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
        if tensors and all(id(t) in self._known for t in tensors):
            with _disable_current_modes(), torch._C.DisableTorchFunction():
                out = func(*args, **kwargs)
            for result in pytree.tree_leaves(out):
                if isinstance(result, torch.Tensor):
                    self._known[id(result)] = result
        else:
            if any(id(t) in self._known for t in tensors):
                args, kwargs = pytree.tree_map_only(torch.Tensor, self._constant, (args, kwargs))
            out = func(*args, **kwargs)
        if self._kept:
            return self._kept_mask(func, out)
        return out

    def _kept_mask(self, func: Any, out: Any) -> Any:
        """``out``, or the known all-true mask in its place when it is the mask of a kept selection."""
        maker = self._makers.maker(func, out)
        selection = self._kept.get(maker) if maker is not None else None
        if maker is None or selection is None or id(out) in self._known:
            return out
        if tuple(out.shape) != selection.shape:
            raise ExportError(
                f"the mask made by {maker[0]} (boolean result {maker[1]}) is {list(out.shape)} while tracing, but "
                f"{list(selection.shape)} on the sample: the model computes otherwise when traced",
                fix="convert for backend='onnxruntime' (which runs the selection as the model makes it)",
            )
        self.masks.append(out)
        with _disable_current_modes(), torch._C.DisableTorchFunction():  # a real tensor, whatever tracing is under way
            known = torch.ones(selection.shape, dtype=torch.bool)
        self._known[id(known)] = known
        self._whole.add(id(known))
        return known

    def _identity(self, value: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``value[mask]`` for a mask known all true: ``value`` with the mask's axes flattened."""
        if tuple(value.shape[: mask.dim()]) != tuple(mask.shape):
            raise ExportError(
                f"a selection by a mask of {list(mask.shape)} over a tensor of {list(value.shape)}",
                fix="convert for backend='onnxruntime' (which runs the selection as the model makes it)",
            )
        return value.reshape(-1, *value.shape[mask.dim() :])

    def _selected(self, value: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``value[mask]`` for a known mask (computed from held inputs alone: Qwen3-Omni's frames by its held
        ``feature_attention_mask``): the rows it keeps taken by constant indices, a size the graph knows, where the
        boolean selection would leave it to the data (``NonZero``; the export fails where the model then pins it)."""
        flat = self._identity(value, mask)
        with _disable_current_modes(), torch._C.DisableTorchFunction():
            rows = mask.reshape(-1).nonzero().reshape(-1).tolist()
        if len(rows) == flat.shape[0]:
            return flat
        return flat[torch.tensor(rows, dtype=torch.int64)]

    def _constant(self, value: torch.Tensor) -> torch.Tensor:
        """A known tensor as a constant of the graph under way (any other tensor as it is)."""
        if id(value) not in self._known:
            return value
        with _disable_current_modes(), torch._C.DisableTorchFunction():
            values, dtype = value.tolist(), value.dtype
        return torch.tensor(values, dtype=dtype)
