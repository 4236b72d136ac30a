"""Gemma 4's layers, which differ from one another, from a tiny config built here (random weights, nothing downloaded),
judged against transformers' own ``model.generate`` on a left-padded batch of two prompts with an image each:

- per-layer sizes: the full-attention layers' heads are twice as wide as the sliding ones' (``global_head_dim``), a
  heterogeneous config whose global ``head_dim`` transformers refuses to read; each layer's cache has its own width;
- KV sharing: the last layer (``num_kv_shared_layers``) keeps no cache and attends to the last earlier layer of its kind
  (transformers' ``DummyLayer`` in the cache): the step takes no cache for it;
- per-layer inputs: Gemma 4 reads a second embedding by token id at every layer, and refuses ``inputs_embeds`` alone
  (it would reverse its embedding to find the ids, which fails at the image's tokens): the step hands it the ids and
  places the image features in its input embedding's output;
- the image's tokens attend each other both ways in the prefill (``use_bidirectional_attention="vision"``, read from
  the processor's ``mm_token_type_ids``), a window of 4 tokens on the sliding layers, all within a 48-token cache.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import tests_environment  # noqa: F401 -- torchvision's operator schemas, before transformers' vision models
import torch
import transformers
from tiny_models import converted_for_rtx_when_it_imports, decodes_as_transformers, drawn_by_fan_in, greedy_scores

GENERATION = {"max_length": 48, "max_batch": 8}
GREEDY: dict[str, Any] = {"max_new_tokens": 6}
IMAGE_TOKEN = 127
#: 4 x 4 patches of 4 x 4 pixels, pooled 2 x 2: 4 image tokens.
SIDE, PATCH, POOL = 4, 4, 2


def gemma4() -> Any:
    """A Gemma 4 of 3 text layers (full, sliding, full), the last sharing the first's cache."""
    text = {
        "vocab_size": 128,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 3,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "global_head_dim": 32,
        "sliding_window": 4,
        "layer_types": ["full_attention", "sliding_attention", "full_attention"],
        "num_kv_shared_layers": 1,
        "vocab_size_per_layer_input": 128,
        "hidden_size_per_layer_input": 8,
        "use_bidirectional_attention": "vision",
        "max_position_embeddings": 64,
        "pad_token_id": 0,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    vision = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "patch_size": PATCH,
        "pooling_kernel_size": POOL,
        "position_embedding_size": 16,
    }
    tokens = {"image_token_id": IMAGE_TOKEN, "boi_token_id": 126, "eoi_token_id": 125, "video_token_id": 124}
    config = transformers.Gemma4Config(text_config=text, vision_config=vision, **tokens)
    torch.manual_seed(0)
    return drawn_by_fan_in(transformers.Gemma4ForConditionalGeneration(config))


class ImageTokenAt(transformers.LogitsProcessor):
    """Makes the image token the only choice when the sequences are ``length`` long."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if input_ids.shape[1] != self.length:
            return scores
        forced = torch.full_like(scores, -float("inf"))
        forced[:, IMAGE_TOKEN] = 0
        return forced


def inputs() -> dict[str, torch.Tensor]:
    """Two prompts (two text tokens, the image's 4 tokens, four text tokens; the first left-padded by 2, the second
    with 2 more text tokens), each with its image as patches and their positions, and the tokens' modalities."""
    text = torch.randint(3, 90, (1, 6), generator=torch.Generator().manual_seed(0))
    ids = torch.cat([text[:, :2], torch.full((1, (SIDE // POOL) ** 2), IMAGE_TOKEN), text[:, 2:]], 1)
    pad = torch.zeros(1, 2, dtype=ids.dtype)
    batch = torch.cat([torch.cat([pad, ids], 1), torch.cat([ids[:, -2:], ids], 1)])
    mask = torch.ones_like(batch)
    mask[0, :2] = 0
    patches = torch.rand(2, SIDE * SIDE, 3 * PATCH * PATCH, generator=torch.Generator().manual_seed(2))
    rows, columns = torch.meshgrid(torch.arange(SIDE), torch.arange(SIDE), indexing="ij")
    positions = torch.stack([columns, rows], -1).reshape(1, -1, 2).expand(2, -1, -1).clone()
    return {
        "input_ids": batch,
        "attention_mask": mask,
        "mm_token_type_ids": (batch == IMAGE_TOKEN).to(torch.int64),
        "pixel_values": patches,
        "image_position_ids": positions,
    }


def test_gemma4_layers_decode_as_transformers_and_build_on_tensorrt_rtx() -> None:
    """Greedy tokens, every step's scores and 4-beam sequences equal transformers'; the step's cache holds the two
    layers that keep one, each of its own width; TensorRT-RTX's real builder builds both graphs (its engines cannot run
    here, and the module runs the same graphs on ONNX Runtime beside them)."""
    model, sample = gemma4(), inputs()
    module = converted_for_rtx_when_it_imports(model, sample, GENERATION)
    caches = {spec.name: tuple(spec.shape) for spec in module.step.io.inputs if spec.name.startswith("past_key")}
    assert sorted(caches) == [f"past_key_values.{i}.{kind}" for i in range(2) for kind in ("key", "value")]
    assert caches["past_key_values.0.key"][-1] == 32 and caches["past_key_values.1.key"][-1] == 16
    expected, _ = decodes_as_transformers(model, module, sample, **GREEDY)
    assert len(set(expected[:, -6:].flatten().tolist())) > 1
    # a decode step that generates the image token: Gemma 4 embeds its pad token there (and no image is placed)
    forced = {
        **GREEDY,
        "logits_processor": transformers.LogitsProcessorList([ImageTokenAt(sample["input_ids"].shape[1] + 1)]),
    }
    expected, expected_scores = greedy_scores(model.generate, sample, **forced)
    tokens, scores = greedy_scores(module.generate, sample, **forced)
    assert torch.equal(tokens, expected) and bool((expected[:, -5] == IMAGE_TOKEN).all())
    assert float((scores - expected_scores).nan_to_num(nan=0.0).abs().max()) < 1e-3  # -inf at the forced step
    if importlib.util.find_spec("tensorrt_rtx") is not None:
        assert module.vision.engine_bytes and module.step.engine_bytes
