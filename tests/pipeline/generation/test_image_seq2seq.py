"""Image-to-text encoder-decoders (``VisionEncoderDecoderModel``: TrOCR, Donut, Nougat): an image encoder and a text
decoder of another model's code, cross-attending to the image, converted with ``generation=`` as any encoder-decoder
(the encoder graph once per request, the decoder a cached step over the image's cross keys and values).

A tiny random model, a ViT encoder and TrOCR's decoder (its own attention code, not transformers' interface: the step
exports it as it is, although the composite's own module names no attention class), two images: greedy and 4-beam
sequences token-identical to ``model.generate``, every greedy step's scores within 1e-3, and another image gives other
tokens, as transformers'. One conversion, for TensorRT-RTX when it imports (its real builder builds both graphs; the
graphs run on ONNX Runtime beside them), else for ONNX Runtime. Nothing is downloaded."""

from __future__ import annotations

from typing import Any

import pytest
import tests_environment  # noqa: F401 -- torchvision's operator schemas, before transformers imports it
import torch
import transformers
from tiny_models import converted_for_rtx_when_it_imports, decodes_as_transformers, drawn_by_fan_in

from pipeline.generation.encoder_decoder import attention_owners
from pipeline.generation.step_attention import uses_attention_interface
from pipeline.runtime.generation.encoder_decoder import EncoderDecoderModule

GENERATION = {"max_length": 16, "max_batch": 8}
GREEDY: dict[str, Any] = {"max_new_tokens": 8}
SIDE = 16  # 2 x 2 patches of 8 and the class token: 5 encoder states


def trocr_like() -> transformers.VisionEncoderDecoderModel:
    """A ViT encoder (one layer, width 32) and a TrOCR decoder (one layer, vocabulary 96) paired as transformers pairs
    them (``from_encoder_decoder_configs``: the decoder causal, with cross-attention), TrOCR's start token 2."""
    encoder = transformers.ViTConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=48, image_size=SIDE, patch_size=8
    )
    decoder = transformers.TrOCRConfig(
        vocab_size=96, d_model=32, decoder_layers=1, decoder_attention_heads=2, decoder_ffn_dim=48,
        max_position_embeddings=64, pad_token_id=1, bos_token_id=0, eos_token_id=2,
    )  # fmt: skip
    config = transformers.VisionEncoderDecoderConfig.from_encoder_decoder_configs(encoder, decoder)
    config.decoder_start_token_id, config.pad_token_id = 2, 1  # as a TrOCR checkpoint's config.json sets them
    torch.manual_seed(0)
    return drawn_by_fan_in(transformers.VisionEncoderDecoderModel(config))


@pytest.fixture(scope="module")
def converted() -> tuple[Any, dict[str, torch.Tensor], EncoderDecoderModule]:
    model = trocr_like()
    images = {"pixel_values": torch.randn(2, 3, SIDE, SIDE, generator=torch.Generator().manual_seed(1))}
    module = converted_for_rtx_when_it_imports(model, images, GENERATION)
    assert isinstance(module, EncoderDecoderModule)
    return model, images, module


def test_the_decoder_of_another_models_code_decides_the_steps_attention() -> None:
    model = trocr_like()
    assert uses_attention_interface(model)  # transformers' reading of the composite's own module
    assert [type(part).__name__ for part in attention_owners(model)] == [
        "VisionEncoderDecoderModel",
        "TrOCRForCausalLM",
    ]
    assert not uses_attention_interface(model.decoder)


def test_decodes_images_as_transformers(converted: tuple[Any, dict[str, torch.Tensor], EncoderDecoderModule]) -> None:
    model, images, module = converted
    assert [spec.name for spec in module.encoder.io.inputs] == ["pixel_values"]
    expected, _ = decodes_as_transformers(model, module, images, **GREEDY)
    assert len(set(expected[:, 1:].flatten().tolist())) >= 4, expected  # tokens that vary: worth comparing
    other = {"pixel_values": torch.randn(2, 3, SIDE, SIDE, generator=torch.Generator().manual_seed(7)) * 2}
    ours = module.generate(**other, **GREEDY)
    assert not torch.equal(ours, expected)  # the image reaches the decoder
    with torch.no_grad():
        assert torch.equal(ours, model.generate(**other, **GREEDY, do_sample=False))


def test_tensorrt_rtx_builds_both_graphs(converted: tuple[Any, dict[str, torch.Tensor], EncoderDecoderModule]) -> None:
    pytest.importorskip("tensorrt_rtx")
    _model, _images, module = converted
    assert module.encoder.engine_bytes and module.decoder.engine_bytes
