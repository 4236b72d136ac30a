"""A cache layer that keeps its prompt's keys and values under names of its own and a window of generated tokens
(Unlimited-OCR's reference sliding-window layer, transformers' own class): the layout reads the pair it keeps and its
window, and a ``max_length`` that would let the decoding outgrow the window is refused by name (the step keeps every
token). A plain layer, and a sliding-window layer holding its keys as ``keys``, are read as before."""

from __future__ import annotations

import pytest
import tests_environment  # noqa: F401 -- torchvision's operator schemas, before transformers' models
import torch
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer
from transformers.models.unlimited_ocr.modeling_unlimited_ocr import UnlimitedOcrDynamicReferenceSlidingWindowLayer

from converters.errors import InputError
from converters.generation_settings import GenerationSettings
from pipeline.generation.kept_windows import check_kept_windows, kept_elsewhere, kept_window
from pipeline.runtime.generation.layout import CachedLayer


def prefilled(layer: object, tokens: int = 7) -> tuple[torch.Tensor, torch.Tensor]:
    """``layer`` after a prefill of ``tokens`` keys and values [2, 1, tokens, 4]; those keys and values."""
    generator = torch.Generator().manual_seed(tokens)
    keys, values = torch.randn(2, 1, tokens, 4, generator=generator), torch.randn(2, 1, tokens, 4, generator=generator)
    layer.update(keys, values)  # type: ignore[attr-defined]
    return keys, values


def test_a_reference_window_layers_pair_and_window_are_read() -> None:
    layer = UnlimitedOcrDynamicReferenceSlidingWindowLayer(sliding_window=5)
    keys, values = prefilled(layer)
    assert layer.keys.dim() != 4  # its window of generated tokens is empty after the prefill
    found_keys, found_values, names = kept_elsewhere(layer)
    assert names == ("prefill_keys", "prefill_values")
    assert found_keys is not None and found_values is not None
    assert torch.equal(found_keys, keys) and torch.equal(found_values, values)
    assert kept_window(layer) == 5


def test_layers_without_a_kept_pair_or_a_bound() -> None:
    plain, sliding = DynamicLayer(), DynamicSlidingWindowLayer(sliding_window=5)
    prefilled(plain)
    prefilled(sliding)
    assert kept_elsewhere(plain) == (None, None, ()) and kept_window(plain) == 0  # every token kept
    assert sliding.keys.dim() == 4  # read as its keys, its window the model's mask (kept_elsewhere is not asked)


def test_a_max_length_past_the_window_is_refused_with_the_one_that_fits() -> None:
    layout = [CachedLayer(1, 4, 4, torch.float32, window=5), CachedLayer(1, 4, 4, torch.float32)]
    check_kept_windows(torch.nn.Module(), layout, GenerationSettings(max_length=7, max_batch=2))  # 5 + 2 new tokens
    with pytest.raises(InputError, match="the last 5 generated tokens") as refused:
        check_kept_windows(torch.nn.Module(), layout, GenerationSettings(max_length=8, max_batch=2))
    assert "generation={'max_length': 7} or less" in str(refused.value)
    check_kept_windows(torch.nn.Module(), layout[1:], GenerationSettings(max_length=64, max_batch=2))
