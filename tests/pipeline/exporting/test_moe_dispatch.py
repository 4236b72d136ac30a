"""Mixture-of-experts modules that loop over the experts their tokens chose (``for expert_idx in expert_hit`` over a
``nonzero``: Switch Transformers, NLLB-MoE, DBRX, LongCat-Flash, the privacy filter) export as a dense dispatch: the
models convert and match PyTorch, the graph has no data-dependent op left and TensorRT-RTX builds it; the routing may
change at run time (an expert with no tokens, a non-finite output of an expert nobody was routed to); the eager loop
is back after the conversion."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
from model_sources import transformers_models
from rtx_build import assert_builds

import pipeline


def _experts_class() -> type:
    from transformers.models.switch_transformers import modeling_switch_transformers as switch

    return switch.SwitchTransformersExperts


def test_switch_transformers_converts_matches_and_builds_and_its_loop_is_restored() -> None:
    model, sample = transformers_models.build("switch_transformers")
    eager_forward = _experts_class().forward
    module = pipeline.convert(model, sample)  # validates against the model's own loop
    ops = {n.op_type for n in module.onnx.graph.node}
    assert not ops & {"NonZero", "Loop", "If"}, ops
    assert _experts_class().forward is eager_forward
    assert_builds(module)


@pytest.mark.parametrize("architecture", ["nllb-moe", "longcat_flash"])
def test_other_expert_loops_convert_match_and_build(architecture: str) -> None:
    model, sample = transformers_models.build(architecture)
    module = pipeline.convert(model, sample)
    assert "NonZero" not in {n.op_type for n in module.onnx.graph.node}
    assert_builds(module)  # the dispatch's one-hot masks (OneHot) as well as Switch's form


def test_dbrx_converts_and_matches() -> None:
    # transformers' DBRX reads rope_theta off its attention config, which does not declare it: set it as a
    # checkpoint's config would carry it
    config = transformers_models.shrunk_config(
        "dbrx",
        {
            "d_model": 32,
            "n_heads": 2,
            "n_layers": 2,
            "ffn_hidden_size": 32,
            "moe_num_experts": 4,
            "moe_top_k": 2,
            "kv_n_heads": 1,
            "clip_qkv": 8.0,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        },
    )
    config.attn_config.rope_theta = 10000.0
    torch.manual_seed(0)
    model = transformers_models._transformers().AutoModel.from_config(config).eval()
    module = pipeline.convert(model, ((), {"input_ids": transformers_models.token_ids()}))
    assert "NonZero" not in {n.op_type for n in module.onnx.graph.node}
    assert_builds(module)


class Routed(torch.nn.Module):
    """Switch Transformers' experts alone, the routing an input: ``selected`` one-hot ``[T, 1, E]``."""

    def __init__(self) -> None:
        super().__init__()
        config = transformers_models.shrunk_config("switch_transformers")
        self.experts = _experts_class()(config).eval()

    def forward(self, hidden: torch.Tensor, selected: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        return self.experts(hidden, selected, weights)


def test_any_routing_gives_the_eager_loops_result() -> None:
    torch.manual_seed(0)
    model = Routed().eval()
    tokens, experts = 6, model.experts.num_experts
    hidden = torch.randn(tokens, 32)
    weights = torch.rand(tokens, 1)

    def one_hot(choice: list[int]) -> torch.Tensor:
        return torch.nn.functional.one_hot(torch.tensor(choice), experts).unsqueeze(1)

    with torch.no_grad():
        model.experts["expert_3"].wo.weight.fill_(float("inf"))  # its outputs are inf and NaN; nobody goes there
    module = pipeline.convert(model, (hidden, one_hot([0, 1, 2, 2, 0, 1]), weights), validate=False)
    session = ort.InferenceSession(module.onnx.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    for choice in ([0, 0, 0, 0, 0, 0], [2, 1, 2, 1, 0, 0], [1, 1, 1, 1, 1, 2]):
        selected = one_hot(choice)
        with torch.no_grad():
            want = model(hidden, selected, weights).numpy()
        feed = dict(zip(names, [hidden.numpy(), selected.numpy(), weights.numpy()], strict=True))
        (got,) = session.run(None, feed)
        assert np.isfinite(want).all()
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_the_privacy_filters_float32_expert_loop_converts_matches_and_builds() -> None:
    """OpenAI's privacy filter (from the every-type source: the curated list does not have it) keeps GPT-OSS's loop
    and computes every expert in float32; plain export stops at its ``nonzero``."""
    from model_sources import transformers_all_models

    model, (_, kwargs) = transformers_all_models.build("openai_privacy_filter", "OpenAIPrivacyFilterModel")
    module = pipeline.convert(model, kwargs)
    assert "NonZero" not in {n.op_type for n in module.onnx.graph.node}
    assert_builds(module)
