"""A vision-language model's ``masked_scatter`` (image features into the text embeddings) converts without
``NonZero``: TensorRT-RTX builds LLaVA's whole graph as one engine (before, ``NonZero`` split it in two and ran on
ONNX Runtime), and the outputs match PyTorch. A tiny LLaVA with random weights, built from its config."""

from __future__ import annotations

import tests_environment  # noqa: F401 -- torchvision's operator schemas, before transformers' vision models
import torch
import transformers

import pipeline


def test_llava_places_its_image_features_without_nonzero_in_one_tensorrt_rtx_engine() -> None:
    vision = transformers.CLIPVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=32, patch_size=8
    )
    text = transformers.LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, max_position_embeddings=64,
    )  # fmt: skip
    config = transformers.LlavaConfig(vision_config=vision, text_config=text, image_token_id=127, image_seq_length=16)
    torch.manual_seed(0)
    model = transformers.LlavaForConditionalGeneration(config).eval()
    tokens = torch.randint(3, 100, (1, 20), generator=torch.Generator().manual_seed(0))
    tokens[0, 2:18] = 127  # the 16 image tokens
    sample = {"input_ids": tokens, "pixel_values": torch.randn(1, 3, 32, 32)}

    module = pipeline.convert(model, ((), sample), backend="tensorrt-rtx", validation_inputs=1)

    assert "NonZero" not in {n.op_type for n in module.onnx.graph.node}
    assert module.report.segments is None  # one engine: nothing left on ONNX Runtime
    with torch.no_grad():
        want = model(**sample).logits
    torch.testing.assert_close(module(**sample).logits, want, rtol=1e-4, atol=1e-4)
