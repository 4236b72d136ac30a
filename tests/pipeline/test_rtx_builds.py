"""The fp16 and bf16 final graphs of the model tests' models build with the real TensorRT-RTX builder.

``tests/pipeline/test_convert_models.py`` builds their fp32 graphs; ``test_precision_models.py`` and
``test_precision_decoders.py`` build and validate their own fp16/bf16 conversions. Here every model of the first
file is converted at fp16 and bf16 (validation off: accuracy in the low types is what those files test) and its
``module.onnx`` built, dynamic dims with their declared profile. A graph the builder rejects fails the test with the
parser's per-node errors or the builder's log.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from model_zoo import (
    MLP,
    DictOut,
    Gated,
    KeywordOnly,
    ListOut,
    TwoInTwoOut,
    bert_inputs,
    hf_resnet_model,
    hf_vit_model,
    make_cnn,
    tiny_bert_config,
)
from rtx_build import assert_builds
from torch import nn

import pipeline

transformers = pytest.importorskip("transformers")

BERT_DIMS = {0: ("batch", 1, 2, 4), 1: ("seq", 1, 8, 16)}
BERT_DYNAMIC = {name: BERT_DIMS for name in ("input_ids", "attention_mask", "token_type_ids")}


def _seeded(factory: Callable[[], nn.Module]) -> nn.Module:
    torch.manual_seed(0)
    return factory().eval()


#: name -> (model, sample, settings): the models of test_convert_models.py, with its samples and dynamic dims.
CASES: dict[str, Callable[[], tuple[nn.Module, Any, dict[str, Any]]]] = {
    "mlp": lambda: (_seeded(MLP), torch.randn(3, 8), {}),
    "cnn_dynamic": lambda: (make_cnn(), torch.randn(2, 3, 16, 16), {"dynamic": {"x": {0: ("batch", 1, 2, 16)}}}),
    "transformer_encoder_layer": lambda: (
        _seeded(lambda: nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, batch_first=True)),
        torch.randn(2, 5, 16),
        {},
    ),
    "bert_dynamic": lambda: (
        _seeded(lambda: transformers.BertModel(tiny_bert_config())),
        bert_inputs(2, 8, seed=1, lengths=[8, 6]),
        {"dynamic": BERT_DYNAMIC},
    ),
    "two_in_two_out": lambda: (_seeded(TwoInTwoOut), (torch.randn(4, 6), torch.randn(4, 6)), {}),
    "dict_out": lambda: (_seeded(DictOut), torch.randn(3, 5), {}),
    "list_out": lambda: (_seeded(ListOut), torch.randn(3, 5), {}),
    "gated": lambda: (_seeded(Gated), ((torch.randn(3, 4),), {"mask": torch.rand(3, 4), "bias": torch.randn(4)}), {}),
    "keyword_only": lambda: (_seeded(KeywordOnly), ((torch.randn(2, 4),), {"scale": torch.rand(4)}), {}),
    "hf_resnet": lambda: (hf_resnet_model(), {"pixel_values": torch.randn(2, 3, 32, 32)}, {}),
    "hf_vit": lambda: (hf_vit_model(), {"pixel_values": torch.randn(2, 3, 16, 16)}, {}),
    "hf_bert_mlm": lambda: (
        _seeded(lambda: transformers.BertForMaskedLM(tiny_bert_config())),
        bert_inputs(2, 8, seed=2, lengths=[8, 4]),
        {},
    ),
}


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_final_low_precision_graph_builds_with_tensorrt_rtx(case: str, precision: str) -> None:
    model, sample, settings = CASES[case]()
    module = pipeline.convert(model, sample, backend="onnxruntime", precision=precision, validate=False, **settings)
    report = module.report.precision
    assert report is not None and report.precision == precision
    assert_builds(module)
