"""``number - tensor`` (``aten.rsub`` with a Python scalar, which the exporter's decompositions write as ``aten.sub``
with a number as ``self``): XLNet's and ProphetNet's ``1.0 - attention_mask`` convert, match PyTorch and pass
TensorRT-RTX's parser. Tiny models with random weights, built from their configs (nothing downloaded)."""

from __future__ import annotations

import pytest
import tests_environment  # noqa: F401 -- torchvision's operator schemas, before transformers' models
import torch
import transformers
from torch import nn

import pipeline


class OneMinusMask(nn.Module):
    """``x * (1.0 - mask)`` and ``0.5 - 2 * x``: a number minus a tensor of another type, and of the same."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x * (1.0 - mask), torch.rsub(x, 0.5, alpha=2)


@pytest.mark.parametrize("mask_dtype", [torch.int64, torch.float32])
def test_number_minus_tensor_converts_exactly(mask_dtype: torch.dtype) -> None:
    x = torch.randn(2, 5)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 1, 1, 0]], dtype=mask_dtype)
    module = pipeline.convert(OneMinusMask(), (x, mask), validation_inputs=1)
    masked, scaled = module(x, mask)
    assert masked.dtype == torch.float32
    torch.testing.assert_close(masked, x * (1.0 - mask), rtol=0, atol=0)
    torch.testing.assert_close(scaled, 0.5 - 2 * x, rtol=0, atol=0)


def ids(length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, 100, (1, length), generator=torch.Generator().manual_seed(seed))


def assert_converts(model: nn.Module, sample: dict[str, torch.Tensor], outputs: tuple[str, ...]) -> None:
    """Converted with the attention mask (where ``1.0 - mask`` is), validated, the same outputs as PyTorch, and every
    node of the final graph accepted by the parser the check stage ran (TensorRT-RTX's where it imports)."""
    module = pipeline.convert(model, ((), sample), validation_inputs=1)
    report = module.report
    assert report.accuracy is not None and report.accuracy.passed
    assert report.compatibility is not None and report.compatibility["problems"] == []
    got = module(**sample)
    with torch.no_grad():
        want = model(**sample)
    for name in outputs:
        torch.testing.assert_close(getattr(got, name), getattr(want, name), rtol=1e-4, atol=1e-5)


def test_xlnet_with_an_attention_mask_converts() -> None:
    config = transformers.XLNetConfig(vocab_size=128, d_model=32, n_layer=2, n_head=2, d_inner=64)
    model = transformers.XLNetModel(config).eval()
    tokens = ids(8)
    mask = torch.ones_like(tokens)
    mask[0, -2:] = 0
    assert_converts(model, {"input_ids": tokens, "attention_mask": mask}, ("last_hidden_state",))


def test_prophetnet_with_an_attention_mask_converts() -> None:
    config = transformers.ProphetNetConfig(
        vocab_size=128, hidden_size=32, encoder_ffn_dim=64, decoder_ffn_dim=64, num_encoder_layers=1,
        num_decoder_layers=1, num_encoder_attention_heads=2, num_decoder_attention_heads=2,
        max_position_embeddings=64, ngram=2, num_buckets=8, relative_max_distance=16,
    )  # fmt: skip
    model = transformers.ProphetNetModel(config).eval()
    tokens = ids(8)
    sample = {"input_ids": tokens, "attention_mask": torch.ones_like(tokens), "decoder_input_ids": ids(4, seed=1)}
    assert_converts(model, sample, ("last_hidden_state", "last_hidden_state_ngram", "encoder_last_hidden_state"))
