"""A cache layer that keeps its prompt's keys and values under names of its own and a window of generated tokens
(Unlimited-OCR's reference sliding-window layer, transformers' own class): the layout reads the pair it keeps and its
window, which generation masks out token by token as the model evicts them (every layer's one window, or a refusal by
name). A plain layer, and a sliding-window layer holding its keys as ``keys``, are read as before."""

from __future__ import annotations

import pytest
import tests_environment  # noqa: F401 -- torchvision's operator schemas, before transformers' models
import torch
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer
from transformers.models.unlimited_ocr.modeling_unlimited_ocr import UnlimitedOcrDynamicReferenceSlidingWindowLayer

from converters.errors import InputError
from pipeline.generation.kept_windows import kept_elsewhere, kept_window, kept_window_of
from pipeline.runtime.generation.feed import evict
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


def test_one_window_for_every_layer_or_a_refusal_by_name() -> None:
    windowed, plain = CachedLayer(1, 4, 4, torch.float32, window=5), CachedLayer(1, 4, 4, torch.float32)
    assert kept_window_of(torch.nn.Module(), [windowed, windowed]) == 5
    assert kept_window_of(torch.nn.Module(), [plain, plain]) == 0
    with pytest.raises(
        InputError, match=r"different windows of generated tokens \(every token, the last 5\)"
    ) as refused:
        kept_window_of(torch.nn.Module(), [windowed, plain])
    assert refused.value.fix == "convert without generation= (the plain forward)"


def test_each_fed_token_evicts_the_generated_token_a_window_before_it() -> None:
    """A prompt of 4 tokens, a window of 3: feeding the token at column c drops the generated token at c - 3 (the
    prompt's never), as the model's cache keeps its prompt and its last 3 generated tokens, the fed one's included."""
    mask = torch.zeros(2, 12, dtype=torch.int64)
    mask[:, 1:4] = 1  # left padding of one
    seen = []
    for column in range(4, 12):
        mask[:, column] = 1
        evict(mask, 4, column, 3)
        seen.append(mask[0, 4:].nonzero().flatten().add(4).tolist())
    assert seen[:3] == [[4], [4, 5], [4, 5, 6]] and seen[-1] == [9, 10, 11]
    assert mask[:, :4].tolist() == [[0, 1, 1, 1]] * 2
    evict(mask, 4, 11, 0)  # no window: nothing dropped
    assert mask[0, 9:].tolist() == [1, 1, 1]
