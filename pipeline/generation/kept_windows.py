"""Cache layers that keep their keys and values under names of their own, and a window of generated tokens.

A reference sliding-window layer (Unlimited-OCR's ``UnlimitedOcrDynamicReferenceSlidingWindowLayer``) keeps every
token of its prompt (``prefill_keys``, ``prefill_values``) and the last ``sliding_window`` generated ones (its
``keys`` and ``values``, empty after a prefill), evicting older generated tokens. The step's cache is the same
attention over a static cache of every token: the layout reads the heads, widths and dtype from the pair the layer
keeps (:func:`kept_elsewhere`), and generation masks out each generated token as the model evicts it (the window
found by :func:`kept_window_of` is the settings' ``kept_window``, which the runtime's mask follows:
:func:`pipeline.runtime.generation.feed.evict`). Found as what they are, never by the layer's class: a pair of 4-D
floating tensors named ``<name>keys`` and ``<name>values``, and the window the layer's own ``get_max_length`` gives
beyond the tokens it holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from converters.errors import InputError
from pipeline.generation import PLAIN_FORWARD

#: The names a transformers cache layer keeps its keys and values under.
OWN: tuple[str, ...] = ("keys", "values")


def kept_elsewhere(layer: Any) -> tuple[torch.Tensor | None, torch.Tensor | None, tuple[str, ...]]:
    """The keys and values ``layer`` keeps under names of its own while its ``keys`` are empty, and those names: its
    one pair of 4-D floating tensors ``<name>keys`` and ``<name>values``. (None, None, ()) without exactly one."""
    tensors = {
        name: value
        for name, value in vars(layer).items()
        if name not in OWN and isinstance(value, torch.Tensor) and value.dim() == 4 and value.is_floating_point()
    }
    pairs = [(name, f"{name[:-4]}values") for name in tensors if name.endswith("keys")]
    pairs = [(keys, values) for keys, values in pairs if values in tensors]
    if len(pairs) != 1:
        return None, None, ()
    keys, values = pairs[0]
    return tensors[keys], tensors[values], (keys, values)


def kept_window(layer: Any) -> int:
    """The generated tokens ``layer`` keeps beside what it holds now (its prompt's, after a prefill): its
    ``get_max_length()`` beyond its ``get_seq_length()``; 0 for a layer without a bound."""
    try:
        bound, held = int(layer.get_max_length()), int(layer.get_seq_length())
    except (AttributeError, TypeError, ValueError):  # no bound it can say: every token kept
        return 0
    return max(bound - held, 0) if bound > 0 else 0


def kept_window_of(model: torch.nn.Module, layout: Sequence[Any]) -> int:
    """The window of generated tokens every cached layer of ``layout`` keeps (``CachedLayer.window``), which generation
    masks out as the model evicts them (:attr:`GenerationSettings.kept_window`); 0 where no layer evicts. An
    InputError where layers keep different windows, or some keep every token: the step's mask is every layer's."""
    windows = {int(layer.window) for layer in layout if hasattr(layer, "window")}
    if len(windows) <= 1:
        return next(iter(windows), 0)
    said = ", ".join("every token" if window == 0 else f"the last {window}" for window in sorted(windows))
    raise InputError(
        f"{type(model).__name__}'s cache layers keep their prompt and different windows of generated tokens ({said}); "
        "the step masks the tokens a model evicts with one mask for every layer",
        fix=PLAIN_FORWARD,
    )
