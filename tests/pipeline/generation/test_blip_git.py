"""Two image-text models whose images reach the text neither at image tokens nor through a model's own cached cross
states, converted with ``generation=`` and judged against transformers' own ``model.generate`` on tiny random models:
BLIP's captioning head (its ``generate`` runs the vision model once and hands the image embeddings to its text
decoder's ``generate``, whose cross-attention caches them; the prompt handed with its first token its bos and its
last dropped) and GIT (the image features prepended to the text in the prefill, then kept in the cache). A left-padded
batch of 2: greedy sequences and every step's scores, beam search, a saved and loaded directory, and TensorRT-RTX's
real builder on both graphs (the graphs run on ONNX Runtime here). Nothing is downloaded."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import tests_environment  # noqa: F401 -- torchvision's operator schemas, before transformers' vision models
import tiny_models
import torch
import transformers

import pipeline
from converters.errors import InputError
from pipeline.runtime.generation.cross_images import PROMPT_EDIT, CrossImagesModule

GENERATION = {"max_length": 24, "max_batch": 4}
RTX = importlib.util.find_spec("tensorrt_rtx") is not None
VISION = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}
TEXT = {"vocab_size": 64, "hidden_size": 16, "intermediate_size": 32, "num_attention_heads": 2}


def blip() -> Any:
    vision = transformers.BlipVisionConfig(**VISION, image_size=16, patch_size=8)  # 4 patches + the class token
    text = transformers.BlipTextConfig(
        **TEXT, num_hidden_layers=1, max_position_embeddings=32, bos_token_id=1, pad_token_id=0, sep_token_id=2
    )
    config = transformers.BlipConfig(text_config=text.to_dict(), vision_config=vision.to_dict())
    return transformers.BlipForConditionalGeneration(config)


def git() -> Any:
    vision = {**VISION, "image_size": 16, "patch_size": 8}
    config = transformers.GitConfig(
        vision_config=vision, **TEXT, num_hidden_layers=1, max_position_embeddings=32, pad_token_id=0
    )
    return transformers.GitForCausalLM(config)


def batch() -> dict[str, torch.Tensor]:
    """Two prompts of 6 tokens (the second left-padded by 2) and their images."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 60, (2, 6), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    ids[1, :2] = 0
    return {"input_ids": ids, "attention_mask": mask, "pixel_values": torch.randn(2, 3, 16, 16, generator=generator)}


def reference(model: Any, inputs: dict[str, torch.Tensor], **options: Any) -> Any:
    """transformers' ``model.generate`` on copies (BLIP's writes its bos into the prompt it is given)."""
    with torch.no_grad():
        return model.generate(**{k: v.clone() for k, v in inputs.items()}, do_sample=False, **options)


def generates_as_transformers(module: CrossImagesModule, model: Any, inputs: dict[str, torch.Tensor]) -> None:
    """Greedy sequences and every step's scores (within 1e-3), then beam search, as ``model.generate``."""
    scored = {"max_new_tokens": 6, "output_scores": True, "return_dict_in_generate": True}
    ours, theirs = module.generate(**inputs, **scored), reference(model, inputs, **scored)
    assert torch.equal(ours.sequences, theirs.sequences)
    assert len(set(ours.sequences[:, -6:].flatten().tolist())) > 2  # the tokens vary: a decoding bug would show
    assert max(float((a - b).abs().max()) for a, b in zip(ours.scores, theirs.scores, strict=True)) < 1e-3
    beams = {"max_new_tokens": 5, "num_beams": 2}
    assert torch.equal(module.generate(**inputs, **beams), reference(model, inputs, **beams))


@pytest.mark.parametrize("make", [blip, git], ids=["blip", "git"])
def test_generates_as_transformers_does_and_tensorrt_rtx_builds_both_graphs(make: Any, tmp_path: Path) -> None:
    model, inputs = tiny_models.lively(make, 0, 0.3, keep_eos=False), batch()
    backend = "tensorrt-rtx" if RTX else "onnxruntime"
    module = pipeline.convert(model, inputs, generation=GENERATION, backend=backend, validate=False)
    assert isinstance(module, CrossImagesModule)
    if RTX:
        assert module.encoder.engine_bytes and module.decoder.engine_bytes
    generates_as_transformers(module, model, inputs)
    outputs = [spec.name for spec in module.encoder.io.outputs]
    if make is blip:  # the cross-attention's keys and values and the image embeddings; the prompt as BLIP hands it
        assert outputs == ["cross.0.key", "cross.0.value", "encoder_hidden_states"]
        assert dict(module.generation.model_options)[PROMPT_EDIT] == (1, ((0, 1),))
        assert module.dropped_prompt_tokens == 1  # what the CLI cuts the printed prompt by
        assert module.generation.eos_token_id == (2,)  # its text config's separator, which its generate hands on
    else:  # the image positions at the start of the cache: 4 patches + the class token
        assert outputs == ["prefix.0.key", "prefix.0.value"]
        assert module.encoder.io.outputs[0].shape[-2] == 5
        module.save(tmp_path / "git")
        loaded = pipeline.load(tmp_path / "git", backend="onnxruntime")
        assert torch.equal(loaded.generate(**inputs, max_new_tokens=6), reference(model, inputs, max_new_tokens=6))
        with pytest.raises(InputError, match="image positions"):  # 5 image positions + 19 tokens fill the cache
            module.generate(input_ids=torch.ones(1, 19, dtype=torch.int64), pixel_values=inputs["pixel_values"][:1])
        assert module.dropped_prompt_tokens == 0
        # 5 image positions + 6 prompt tokens leave 13 of the 24: refused before any token, not when the cache fills
        with pytest.raises(InputError, match=r"(?s)after 5 image positions plus 14 new ones.*max_new_tokens <= 13"):
            module.generate(**inputs, max_new_tokens=14)
