"""Cache layers that keep their keys and values under names of their own, and a window of generated tokens.

A reference sliding-window layer (Unlimited-OCR's ``UnlimitedOcrDynamicReferenceSlidingWindowLayer``) keeps every
token of its prompt (``prefill_keys``, ``prefill_values``) and the last ``sliding_window`` generated ones (its
``keys`` and ``values``, empty after a prefill), evicting older generated tokens. The step's cache is the same
attention over a static cache of every token: the layout reads the heads, widths and dtype from the pair the layer
keeps (:func:`kept_elsewhere`), and the step decodes as the model while the window holds every generated token
(``window + 2`` new tokens: the first comes from the prefill, and the window includes the query's own), which
:func:`check_kept_windows` asks of ``max_length``. Found as what they are, never by the layer's class: a pair of 4-D
floating tensors named ``<name>keys`` and ``<name>values``, and the window the layer's own ``get_max_length`` gives
beyond the tokens it holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from converters.errors import InputError
from converters.generation_settings import GenerationSettings

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


def check_kept_windows(model: torch.nn.Module, layout: Sequence[Any], generation: GenerationSettings) -> None:
    """An InputError when a cached layer keeps a window of generated tokens (``CachedLayer.window``) that
    ``max_length`` lets the decoding outgrow: the step keeps every token, so it decodes as the model for
    ``window + 2`` new tokens at most, and a prompt of one token may generate ``max_length - 1``."""
    windows = [int(getattr(layer, "window", 0)) for layer in layout]
    windows = [window for window in windows if window > 0]
    if not windows or generation.max_length <= min(windows) + 2:
        return
    most = min(windows) + 2
    raise InputError(
        f"{type(model).__name__}'s cache keeps its prompt and the last {min(windows)} generated tokens, evicting older "
        f"ones; the step keeps every token, so it decodes as the model for {most} new tokens at most, but generation "
        f"max_length={generation.max_length} lets a prompt of one token generate {generation.max_length - 1}",
        fix=f"pass generation={{'max_length': {most}}} or less (a prompt and its new tokens), or convert without "
        "generation=",
    )
