"""A view of flattened tokens taken back to [batch, sequence, hidden] (Aria's mixture of experts views its tokens
back for the shared experts) exports with batch and sequence dynamic: PyTorch writes the merged dimension's stride
as a ``Min`` that its contiguity check multiplies into a guard its solver cannot prove (``s*Min(32, 32*s) == 32*s``),
so the export failed; the view is taken of a contiguous copy (pipeline/exporting/composites.py)."""

from __future__ import annotations

import tests_environment  # noqa: F401 -- torchvision's operator schemas, before transformers' models
import torch
import transformers

import pipeline

DYNAMIC = {"x": {0: ("batch", 1, 2, 8), 1: ("sequence", 1, 5, 64)}}


class Unflatten(torch.nn.Module):
    """Tokens flattened, then viewed and reshaped back."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.view(-1, x.size(-1))
        return flat.view(x.shape) * 2 + flat.reshape(x.shape)


def test_views_of_flattened_tokens_keep_the_sequence_dynamic() -> None:
    model = Unflatten().eval()
    module = pipeline.convert(model, (torch.randn(2, 5, 32),), dynamic=DYNAMIC)
    for shape in ((1, 1, 32), (3, 7, 32), (8, 64, 32)):
        x = torch.randn(shape)
        torch.testing.assert_close(module(x), model(x))


def test_arias_mixture_of_experts_converts_with_a_dynamic_sequence() -> None:
    """The real layer (its router, experts and shared experts, as a model built from the config dispatches its
    experts), one sequence length after another."""
    config = transformers.AriaTextConfig(
        hidden_size=32,
        intermediate_size=16,
        moe_num_experts=4,
        moe_topk=2,
        moe_num_shared_experts=1,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=64,
    )
    torch.manual_seed(0)
    layer = transformers.AriaTextForCausalLM(config).model.layers[0].mlp.eval()
    with torch.no_grad():
        for parameter in layer.parameters():
            parameter.normal_(0, 0.3)
    module = pipeline.convert(layer, (torch.randn(2, 5, 32),), dynamic={"hidden_states": DYNAMIC["x"]})
    for shape in ((1, 1, 32), (2, 9, 32)):
        x = torch.randn(shape)
        torch.testing.assert_close(module(x), layer(x), atol=1e-4, rtol=1e-4)
