"""``as_strided`` reads memory, not elements (pipeline.exporting.strided_views): of a view whose strides are not
row-major, and of a dense result laid out otherwise, the converted graph gathers what PyTorch reads. Longformer's
sliding-window chunks (its ``_chunk``) and the tiny model itself match PyTorch."""

from __future__ import annotations

import pytest
import tests_environment  # noqa: F401 -- torchvision's operator schemas, before transformers' models
import torch
import transformers
from rtx_build import assert_builds

import pipeline


class ViewOfTranspose(torch.nn.Module):
    """``reshape`` of a transposed tensor that is a view (non-row-major strides), then overlapping chunks."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        view = x.transpose(1, 2).reshape(2, 8, 16).view(2, 2, 4, 16)
        return view.as_strided(size=[2, 3, 4, 16], stride=list(view.stride()[:1]) + [view.stride(1) // 2, 32, 1])


class ResultKeepsStrides(torch.nn.Module):
    """An elementwise op on a transposed tensor keeps its strides: a new tensor whose memory is not row-major."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dense = x.transpose(1, 2).reshape(2, 8, 16) * 2
        return dense.view(2, 2, 4, 16).as_strided(size=[2, 3, 4, 16], stride=[128, 32, 16, 1])


class Contiguous(torch.nn.Module):
    """The plain case stays as it was."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(2, 2, 4, 16).as_strided(size=[1, 3, 4, 16], stride=[128, 32, 16, 1], storage_offset=16)


@pytest.mark.parametrize(
    ("module", "shape"),
    [(ViewOfTranspose(), (1, 8, 2, 16)), (ResultKeepsStrides(), (1, 8, 2, 16)), (Contiguous(), (2, 8, 16))],
    ids=["view", "dense-result", "contiguous"],
)
def test_as_strided_gathers_what_pytorch_reads(module: torch.nn.Module, shape: tuple[int, ...]) -> None:
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    converted = pipeline.convert(module, (x,), validation_inputs=1)
    torch.testing.assert_close(converted(x), module(x), rtol=0, atol=0)


def test_longformer_sliding_window_attention_matches() -> None:
    config = transformers.LongformerConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        attention_window=4, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LongformerModel(config).eval()
    ids = torch.randint(3, 100, (1, 8), generator=torch.Generator().manual_seed(0))
    sample = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    module = pipeline.convert(model, ((), sample), validation_inputs=1)
    with torch.no_grad():
        want = model(**sample).last_hidden_state
    torch.testing.assert_close(module(**sample).last_hidden_state, want, rtol=1e-4, atol=1e-5)


def test_tensorrt_rtx_builds_the_rewritten_gather() -> None:
    x = torch.randn(1, 8, 2, 16, generator=torch.Generator().manual_seed(0))
    assert_builds(pipeline.convert(ResultKeepsStrides(), (x,), validate=False))
