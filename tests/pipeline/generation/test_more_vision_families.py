"""Vision-language decoders whose images reach the prompt in ways LLaVA's do not, from tiny configs built here (random
weights, nothing downloaded), judged against transformers' own ``model.generate`` on a left-padded batch of two
prompts with an image each:

- Emu3 (as Chameleon, which the family sweep runs) turns an image into tokens of its own vocabulary (a VQ tokenizer's
  codes, mapped to BPE ids by the tokenizer's ``vocabulary_map``) and embeds them: the vision graph is the VQ encoder,
  the nearest code, the mapping and the embedding (the model's ``get_image_features``), its features placed at the
  ``<image>`` tokens. It also returns the codes themselves, per image: token ids, not features added elsewhere;
- Fuyu has no tower: its image is its flattened patches, projected by one linear layer, and its
  ``get_image_features`` gives them unpooled (``last_hidden_state``, no ``pooler_output``), which the model places.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import tests_environment  # noqa: F401 -- torchvision's operator schemas, before transformers' vision models
import torch
import transformers
from tiny_models import (
    TINY_TEXT,
    converted_for_rtx_when_it_imports,
    decodes_as_transformers,
    drawn_by_fan_in,
    greedy_scores,
)

import pipeline

GENERATION = {"max_length": 48, "max_batch": 8}
GREEDY: dict[str, Any] = {"max_new_tokens": 6}
IMAGE_TOKEN = 127
#: A VQ tokenizer of 16 codes over a 32x32 image, downsampled 8 times (4x4 codes), its BPE ids 100-115.
VQ = {"base_channels": 32, "channel_multiplier": [1, 1, 1, 1], "num_res_blocks": 1}


def batch(ids: torch.Tensor, image: torch.Tensor) -> dict[str, torch.Tensor]:
    """``ids`` (one prompt) left-padded by 2 and a copy with 2 text tokens before it and another image."""
    pad = torch.zeros(1, 2, dtype=ids.dtype)
    other = torch.randn(image.shape, generator=torch.Generator().manual_seed(1))
    return {
        "input_ids": torch.cat([torch.cat([pad, ids], 1), torch.cat([ids[:, -2:], ids], 1)]),
        "attention_mask": torch.cat(
            [torch.cat([pad * 0, torch.ones_like(ids)], 1), torch.ones(1, ids.shape[1] + 2)]
        ).to(ids.dtype),
        "pixel_values": torch.cat([image, other]),
    }


def prompt(image_tokens: int) -> torch.Tensor:
    """Two text tokens, the image's tokens, four text tokens."""
    text = torch.randint(3, 90, (1, 6), generator=torch.Generator().manual_seed(0))
    return torch.cat([text[:, :2], torch.full((1, image_tokens), IMAGE_TOKEN), text[:, 2:]], 1)


def image() -> torch.Tensor:
    return torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(2))


def test_emu3_image_tokens_with_their_rows_decode_as_transformers() -> None:
    """Emu3 ends every row of codes with its ``<|extra_200|>`` token: 4 rows of 4 codes are 20 image tokens."""
    codes = {f"<|visual token {code:06d}|>": 100 + code for code in range(16)}
    config = transformers.Emu3Config(
        text_config={**TINY_TEXT, "num_hidden_layers": 1, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2},
        vq_config={
            **VQ,
            "embed_dim": 4,
            "codebook_size": 16,
            "temporal_downsample_factor": 1,
            "attn_resolutions": [],
            "hidden_size": 32,
        },
        vocabulary_map={"<image>": IMAGE_TOKEN, "<|extra_200|>": 116, **codes},
    )
    torch.manual_seed(0)
    model = drawn_by_fan_in(transformers.Emu3ForConditionalGeneration(config))
    inputs = {**batch(prompt(20), image()), "image_sizes": torch.tensor([[32, 32], [32, 32]])}
    module = pipeline.convert(model, inputs, generation=GENERATION, validate=False)
    decodes_as_transformers(model, module, inputs, **GREEDY)


def test_fuyu_flattened_patches_decode_as_transformers_and_build_on_tensorrt_rtx() -> None:
    """Greedy tokens and scores; transformers' own beam search fails on Fuyu (it repeats the image's ``pooler_output``
    for the beams, and Fuyu gives its patches as ``last_hidden_state``), so the module's beams are compared with each
    prompt's greedy search, which 1 beam is."""
    text = {**TINY_TEXT, "num_hidden_layers": 1, "model_type": "persimmon", "partial_rotary_factor": 0.5}
    config = transformers.FuyuConfig(
        text_config={k: v for k, v in text.items() if k not in ("head_dim", "num_key_value_heads")},
        image_size=32,
        patch_size=8,
        image_token_id=IMAGE_TOKEN,
    )
    torch.manual_seed(0)
    model = drawn_by_fan_in(transformers.FuyuForCausalLM(config))
    pixels = image().reshape(1, 3, 4, 8, 4, 8).permute(0, 2, 4, 3, 5, 1).reshape(1, 16, 192)  # rows of patches
    inputs = batch(prompt(16), pixels)
    # TensorRT-RTX's real builder builds both graphs; its engines cannot run here, and the module runs the same graphs
    # on ONNX Runtime beside them
    module = converted_for_rtx_when_it_imports(model, inputs, GENERATION)
    expected, expected_scores = greedy_scores(model.generate, inputs, **GREEDY)
    tokens, scores = greedy_scores(module.generate, inputs, **GREEDY)
    assert torch.equal(tokens, expected) and len(set(tokens[:, -6:].flatten().tolist())) > 1
    assert float((scores - expected_scores).abs().max()) < 1e-3
    with torch.no_grad():
        assert torch.equal(module.generate(**inputs, **GREEDY, num_beams=1), expected)
    if importlib.util.find_spec("tensorrt_rtx") is not None:
        assert module.vision.engine_bytes and module.step.engine_bytes
