"""Diffusion models in low precision: a UNet in FP8 W8A8 (the quantize stage) converts, matches by the accuracy
policy and builds with TensorRT-RTX for an SM89 target; the CLIP and T5 text encoders in bf16 convert and build.
The measured table (UNet, Flux, CLIP, T5 in fp16/bf16/fp8) is in the README's diffusion section."""

from __future__ import annotations

import pytest
import torch
from diffusion_models import tiny_unet
from quantize_support import build_with_tensorrt_rtx
from rtx_build import assert_builds

import pipeline


def test_a_unet_in_fp8_converts_and_builds_for_sm89() -> None:
    unet = tiny_unet()
    sample = ((torch.randn(2, 4, 8, 8), torch.tensor(10), torch.randn(2, 3, 8)), {"return_dict": False})
    module = pipeline.convert(unet, sample, precision="fp8")  # validated against PyTorch by the quantize policy
    report = module.report.quantization
    assert report is not None and report.share > 0.9, report.summary_lines() if report else None
    (got,), (want,) = module(*sample[0], **sample[1]), unet(*sample[0], **sample[1])
    assert float((got - want.detach()).norm() / want.norm()) < 0.2  # FP8 E4M3: a few percent per quantized input
    assert build_with_tensorrt_rtx(module.onnx, sm89=True) > 0  # FP8 builds only for compute capability >= 8.9


@pytest.mark.parametrize("encoder", ["clip"])  # T5 too in the README table; one here keeps the budget
def test_text_encoders_in_bf16_convert_and_build(encoder: str) -> None:
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    torch.manual_seed(0)
    if encoder == "clip":
        config = CLIPTextConfig(
            vocab_size=1000,
            hidden_size=32,
            intermediate_size=37,
            num_hidden_layers=1,
            num_attention_heads=4,
            max_position_embeddings=77,
            bos_token_id=0,
            eos_token_id=2,
        )
        model: torch.nn.Module = CLIPTextModel(config).eval()
    else:
        model = T5EncoderModel(T5Config(vocab_size=1000, d_model=32, d_ff=37, d_kv=8, num_layers=1, num_heads=4)).eval()
    module = pipeline.convert(model, torch.randint(3, 1000, (1, 16)), precision="bf16")
    assert module.report.precision is not None and module.report.precision.precision == "bf16"
    assert module.report.accuracy is not None and module.report.accuracy.passed
    assert_builds(module)
