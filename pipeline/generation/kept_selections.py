"""Selections by a boolean mask that keep every element on the sample: ``x[mask]`` where the model computes ``mask``
from its data (Idefics2's, Idefics3's and SmolVLM's towers drop all-zero padding images with
``pixel_values[real_images_inds]``, ``real_images_inds`` computed from the pixels).

Such a selection exports as ``NonZero``, whose output size depends on the data: TensorRT-RTX's parser has no kernel
for it, and what the model computes from the mask (how many images it kept, ``.tolist()``) becomes a size TensorRT
reads as a shape tensor. A graph for one real image at a time keeps every element of such a mask: run once eagerly on
the sample, :func:`kept_selections` finds the masks that select and keep everything there, and names each by the call
that made it (the torch function, and how many boolean results of it came before). Traced again inside
:class:`~pipeline.generation.known_values.KnownValues` with them, each such mask is known (all true) from the call
that makes it: what the code computes from it alone runs eagerly (the count of kept images is a number), and the
selection is the identity (the selected axes flattened). The graph then assumes every element kept, and also says
whether the masks the model computed on the call kept every element and whether they kept none
(:data:`~pipeline.runtime.generation.kept_images.ALL_KEPT`, :data:`~pipeline.runtime.generation.kept_images.NONE_KEPT`):
the runtime (:func:`~pipeline.runtime.generation.kept_images.kept_features`) takes the features, or none for an input
the model drops whole (a padding image), and refuses one it keeps in part.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch._C._functorch import is_batchedtensor
from torch.overrides import TorchFunctionMode

#: The call that makes a boolean tensor: the torch function's name, and how many boolean results of it came before.
Maker = tuple[str, int]


@dataclasses.dataclass(frozen=True)
class KeptSelection:
    """A mask the model computes from its data and selects by (``x[mask]``), all true on the sample: the call that
    made it (:data:`Maker`) and its shape."""

    maker: Maker
    shape: tuple[int, ...]


def function_name(func: Any) -> str:
    """A torch function's name, the same whether the call runs eagerly or under tracing (``TensorBase.__ne__``)."""
    return f"{getattr(func, '__module__', None) or ''}.{getattr(func, '__qualname__', None) or repr(func)}"


class BooleanMakers:
    """Counts the boolean results of each torch function, in call order: :meth:`maker` names the next one."""

    def __init__(self) -> None:
        self._counts: collections.Counter[str] = collections.Counter()

    def maker(self, func: Any, out: Any) -> Maker | None:
        """The maker of ``out`` when it is a boolean tensor (None otherwise)."""
        if not isinstance(out, torch.Tensor) or out.dtype != torch.bool:
            return None
        name = function_name(func)
        self._counts[name] += 1
        return name, self._counts[name] - 1


def selecting_mask(func: Any, args: Any) -> torch.Tensor | None:
    """The boolean mask of ``x[mask]`` (``Tensor.__getitem__`` with a boolean tensor as the whole index), else None."""
    if func is not torch.Tensor.__getitem__ or len(args) != 2:
        return None
    index = args[1]
    return index if isinstance(index, torch.Tensor) and index.dtype == torch.bool and index.dim() else None


def kept_selections(run: Callable[[], Any]) -> tuple[KeptSelection, ...]:
    """The masks ``run()`` computes and selects by that keep every element, ``run`` called once, eagerly (see the
    module docstring). A mask that drops an element on this run is not among them."""
    recorder = _Recorder()
    with torch.no_grad(), recorder:
        run()
    return tuple(recorder.kept.values())


def by_element(run: Callable[[], torch.Tensor], selection: KeptSelection, whole: torch.Tensor) -> bool:
    """Whether the features ``run()`` gives [rows, hidden] are the mask's elements' own rows in order, as many each:
    ``whole`` (the features with every element kept) cut into one block per element of ``selection``'s mask, the
    model's features with the mask's last element dropped (``run`` called once, eagerly, with that mask in place of the
    model's) are the other elements' blocks. Then the features of an input whose mask drops some elements are its
    kept elements' blocks of the features with every element kept."""
    elements = math.prod(selection.shape)
    if elements < 2 or whole.dim() != 2 or whole.shape[0] % elements:
        return False
    dropping = torch.ones(selection.shape, dtype=torch.bool)
    dropping.view(-1)[-1] = False
    try:
        with torch.no_grad(), _Substitute(selection.maker, dropping):
            dropped = run()
    except Exception:  # noqa: BLE001 - the model refusing the mask: not by element
        return False
    expected = whole.reshape(elements, -1, whole.shape[-1])[dropping.reshape(-1)].reshape(-1, whole.shape[-1])
    return tuple(dropped.shape) == tuple(expected.shape) and torch.allclose(dropped, expected, atol=1e-5, rtol=1e-4)


class _Substitute(TorchFunctionMode):
    """The boolean result of ``maker`` replaced by ``mask``."""

    def __init__(self, maker: Maker, mask: torch.Tensor) -> None:
        super().__init__()
        self._maker, self._mask = maker, mask
        self._makers = BooleanMakers()

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: dict[str, Any] | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if self._makers.maker(func, out) == self._maker and tuple(out.shape) == tuple(self._mask.shape):
            return self._mask.clone()
        return out


class _Recorder(TorchFunctionMode):
    """Names every boolean result by its maker; a selection by one that keeps every element, there and when it was
    made, is kept."""

    def __init__(self) -> None:
        super().__init__()
        self._makers = BooleanMakers()
        # by id, each with a weak reference (an id reused by a later tensor is not taken for it) and whether it was
        # all true when made
        self._made: dict[int, tuple[Maker, weakref.ref[torch.Tensor], bool]] = {}
        self._dropping: set[Maker] = set()
        self.kept: dict[Maker, KeptSelection] = {}

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: dict[str, Any] | None = None) -> Any:
        mask = selecting_mask(func, args)
        made = self._maker_of(mask) if mask is not None else None
        if mask is not None and made is not None:
            maker, whole = made
            if whole and bool(mask.all()) and maker not in self._dropping:
                self.kept[maker] = KeptSelection(maker, tuple(mask.shape))
            else:  # one use that drops an element: the mask is the data's
                self._dropping.add(maker)
                self.kept.pop(maker, None)
        out = func(*args, **(kwargs or {}))
        named = self._makers.maker(func, out)
        # an in-place result keeps the maker of its tensor; one made under vmap (a mask function transformers maps over
        # the positions: Gemma 4's audio tower) is one element's, which has no value to read and selects nothing here
        if named is not None and self._maker_of(out) is None and not is_batchedtensor(out):
            self._made[id(out)] = (named, weakref.ref(out), bool(out.all()))
        return out

    def _maker_of(self, tensor: torch.Tensor) -> tuple[Maker, bool] | None:
        """The maker of a boolean result of this run, and whether it was all true when made (None: not one)."""
        entry = self._made.get(id(tensor))
        if entry is None or entry[1]() is not tensor:
            return None
        return entry[0], entry[2]
