"""A decode step that generates one of the model's placeholder tokens embeds it as the model's own forward does with
no media. Muse Spark embeds its image, video and audio placeholders as token 0 (``llm_input_ids[multimodal_mask] =
0``); the step embedded a generated audio token with its own row, and the next step's logits were about 1.0 away (its
sweep row's validation refused it). Built by the every-type source from transformers' small config (random weights,
nothing downloaded)."""

from __future__ import annotations

import importlib.util

import tests_environment  # noqa: F401 -- torchvision's operator schemas, before transformers' vision models
import torch
import transformers
from model_sources import transformers_all_models as every
from tiny_models import converted_for_rtx_when_it_imports, greedy_scores

from pipeline.generation.placeholders import placeholder_rows


class TokenAt(transformers.LogitsProcessor):
    """Makes ``token`` the only choice when the sequences are ``length`` long."""

    def __init__(self, length: int, token: int) -> None:
        self.length, self.token = length, token

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if input_ids.shape[1] != self.length:
            return scores
        forced = torch.full_like(scores, -float("inf"))
        forced[:, self.token] = 0
        return forced


def test_a_generated_audio_placeholder_is_embedded_as_the_model_embeds_it() -> None:
    """The video and audio placeholders are found embedded as token 0's row (the image token's decode row is the
    step's features); forced to generate the audio token at the second new token, the module's tokens and every
    step's scores equal transformers' (the graphs run on ONNX Runtime; TensorRT-RTX's real builder builds both, its
    engines cannot run here)."""
    model, (_args, sample) = every.build("muse_spark", "MuseSparkForConditionalGeneration")
    model.generation_config.eos_token_id = None
    config = model.config
    ids, rows = placeholder_rows(model, config.image_token_id)
    assert {config.video_token_id, config.audio_token_id} <= set(ids.tolist())
    zero = model.get_input_embeddings().weight[0].detach()
    assert all(torch.equal(row, zero) for row in rows)
    module = converted_for_rtx_when_it_imports(model, sample, {"max_length": 40, "max_batch": 2})
    if importlib.util.find_spec("tensorrt_rtx") is not None:  # the step with the placeholder rows, built for real
        assert module.vision.engine_bytes and module.step.engine_bytes
    forced = transformers.LogitsProcessorList([TokenAt(sample["input_ids"].shape[1] + 1, config.audio_token_id)])
    options = {"max_new_tokens": 5, "logits_processor": forced}
    expected, expected_scores = greedy_scores(model.generate, sample, **options)
    tokens, scores = greedy_scores(module.generate, sample, **options)
    assert torch.equal(tokens, expected) and bool((expected[:, -4] == config.audio_token_id).all())
    assert float((scores - expected_scores).nan_to_num(nan=0.0).abs().max()) < 1e-3  # -inf at the forced step
