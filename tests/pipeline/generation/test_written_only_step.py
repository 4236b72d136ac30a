"""A decoder-only step handed the written cache positions only (pipeline/generation/decoder_static_check.py).

GPT-Neo's own attention code (not through transformers' ``AttentionInterface``) cuts its local window from a causal
buffer by the keys' length. Over the step's whole static cache that length is the capacity: the window lands at the
end of the cache, and a local layer whose window is shorter than the capacity attends to unwritten positions. Before
the export, the step in PyTorch is checked against the model's own forward; it differs, so the conversion hands the
model the written positions only (keys, values and mask cut to ``past_length`` plus the step's tokens; the cache still
written in place and returned whole). A small GPT-Neo (window 4, capacity 24) then decodes a left-padded batch as
``model.generate`` does (greedy tokens, every step's scores, 4 beams), saved and loaded; the real TensorRT-RTX builder
builds its step when it imports (the graph runs on ONNX Runtime beside the engine, which cannot run here).

A model whose own attention reads the static cache otherwise than transformers' growing cache over both forms of the
step (here: a GPT-Neo whose attention reads its layer's whole storage after writing it, a pattern of models that read
``cache.layers[i].keys``) is refused before the export with the step, the difference and a fix.
"""

from __future__ import annotations

import importlib.util
import logging
import warnings
from pathlib import Path
from typing import Any

import pytest
import tests_environment  # noqa: F401 -- torchvision's operator schemas, before transformers imports it
import torch
import transformers
from tiny_models import decodes_as_transformers, drawn_by_fan_in
from transformers.models.gpt_neo import modeling_gpt_neo

import pipeline
from converters.generation_settings import GenerationSettings
from pipeline.generation.decoder_static_check import checked_prompt, checked_step, difference
from pipeline.generation.model_cache import model_cache_layout
from pipeline.generation.step import CachedStep
from pipeline.runtime.executors import EngineNotRunnableWarning
from pipeline.runtime.generation.module import GenerativeModule

RTX = importlib.util.find_spec("tensorrt_rtx") is not None
BACKEND = {"backend": "tensorrt-rtx", "trt_engine_cache": False} if RTX else {}
GENERATION = {"max_length": 24, "max_batch": 8}
GREEDY: dict[str, Any] = {"max_new_tokens": 8, "do_sample": False}


def gpt_neo(model_class: type = transformers.GPTNeoForCausalLM) -> Any:
    """A small GPT-Neo: a global then a local layer of window 4 (shorter than the capacity), width 32, vocabulary
    of 128."""
    config = transformers.GPTNeoConfig(
        vocab_size=128,
        hidden_size=32,
        num_layers=2,
        num_heads=2,
        attention_types=[[["global", "local"], 1]],
        window_size=4,
        max_position_embeddings=64,
        intermediate_size=64,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    return drawn_by_fan_in(model_class(config))


@pytest.fixture(scope="module")
def inputs() -> dict[str, torch.Tensor]:
    """Two prompts of 7 and 4 tokens, the second left-padded."""
    ids = torch.randint(3, 128, (2, 7), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    ids[1, :3], mask[1, :3] = 0, 0
    return {"input_ids": ids, "attention_mask": mask}


@pytest.fixture(scope="module")
def converted(inputs: dict[str, torch.Tensor]) -> tuple[Any, GenerativeModule, list[str]]:
    """The small GPT-Neo, converted for TensorRT-RTX when it imports, else for ONNX Runtime (not validated: the test
    compares with transformers itself), and the conversion's log of the check."""
    model = gpt_neo()
    logger = logging.getLogger("pipeline.generation.decoder_static_check")
    said: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())  # type: ignore[method-assign]
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", EngineNotRunnableWarning)
            module = pipeline.convert(model, inputs, generation=GENERATION, validate=False, **BACKEND)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert isinstance(module, GenerativeModule)
    return model, module, said


def test_over_the_whole_capacity_gpt_neos_local_window_is_misplaced(inputs: dict[str, torch.Tensor]) -> None:
    """What the conversion's choice rests on: over the whole static cache the step's logits are not the model's own
    from the prompt's last token on; over the written positions they are."""
    model = gpt_neo()
    generation = GenerationSettings(**GENERATION, pad_token_id=0)
    layout, _ = model_cache_layout(model, inputs["input_ids"])
    prompt = checked_prompt(inputs["input_ids"], generation)
    step = CachedStep(model, len(layout), use_interface=False)
    found = difference(model, step, layout, *prompt, generation)
    assert found is not None and found.step == 0 and found.worst > 0.01
    step.written_only = True
    assert difference(model, step, layout, *prompt, generation) is None
    chosen = checked_step(model, layout, False, inputs["input_ids"], generation)
    assert chosen.written_only


def test_gpt_neo_decodes_as_transformers(
    converted: tuple[Any, GenerativeModule, list[str]], inputs: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    model, module, said = converted
    assert any("written cache positions only" in line for line in said)
    expected, _ = decodes_as_transformers(model, module, inputs, **GREEDY)
    assert len(set(expected[:, 7:].flatten().tolist())) > 3  # tokens that vary: a decoding that could go wrong
    module.save(tmp_path / "gpt_neo")
    loaded = pipeline.load(tmp_path / "gpt_neo")
    with torch.no_grad():
        assert torch.equal(loaded.generate(**inputs, **GREEDY), expected)


@pytest.mark.skipif(not RTX, reason="TensorRT-RTX is not installed")
def test_tensorrt_rtx_builds_the_written_only_step(converted: tuple[Any, GenerativeModule, list[str]]) -> None:
    """Built, whole; its ``past_length`` (a shape tensor: the step slices the cache by it) spans every cache position
    in the engine's profiles, not the sample's one value (an engine for a prefill only): tuned for an empty cache in
    the prompt's profile, a half-full one in the decode profile (which the real builder built)."""
    from pipeline.backends.tensorrt.build import parse_network
    from pipeline.backends.tensorrt.shape_inputs import profile_values, with_values
    from pipeline.runtime.tensorrt.library import TENSORRT_RTX
    from pipeline.runtime.tensorrt.profiles import optimization_profiles

    _, module, _ = converted
    assert module.engine_bytes and not getattr(module, "segments", None)
    assert "past_length" not in dict(module.settings.shape_tensor_values)
    parsed = parse_network(module.onnx, library=TENSORRT_RTX)
    last = GENERATION["max_length"] - 1
    values = profile_values(parsed[1], module.settings)
    assert values == {"past_length": ((0,), (0,), (last,))}
    profiles = with_values(optimization_profiles(module.io, module.settings), values, module.settings)
    assert [p["input_ids"].max[1] > 1 for p in profiles] == [True, False]  # the prompt's, then the decode profile
    assert [p["past_length"].opt for p in profiles] == [(0,), ((last + 1) // 2,)]


class _ReadsItsStorage(modeling_gpt_neo.GPTNeoSelfAttention):
    """GPT-Neo's attention reading its cache layer's storage after writing it, rather than what ``update`` returns:
    transformers' growing cache holds the same, a static cache does not."""

    def forward(self, hidden_states: torch.Tensor, attention_mask: Any = None, layer_past: Any = None, **kwargs: Any):  # type: ignore[no-untyped-def]
        query, key, value = (
            self._split_heads(projection(hidden_states), self.num_heads, self.head_dim)
            for projection in (self.q_proj, self.k_proj, self.v_proj)
        )
        if layer_past is not None:
            layer_past.update(key, value, self.layer_id)
            key, value = layer_past.layers[self.layer_id].keys, layer_past.layers[self.layer_id].values
        out, weights = self._attn(query, key, value, attention_mask)
        return self.out_proj(self._merge_heads(out, self.num_heads, self.head_dim)), weights


class _StorageReadingGPTNeo(transformers.GPTNeoForCausalLM):
    def __init__(self, config: Any) -> None:
        super().__init__(config)
        for block in self.transformer.h:
            own = block.attn.attention
            reading = _ReadsItsStorage(config, own.attention_type, own.layer_id)
            reading.load_state_dict(own.state_dict())
            block.attn.attention = reading


def test_a_model_that_decodes_over_neither_form_of_the_step_is_refused(inputs: dict[str, torch.Tensor]) -> None:
    model = gpt_neo(_StorageReadingGPTNeo)
    with torch.no_grad():  # transformers' own decoding runs: its growing cache holds only what was written
        model.generate(**inputs, max_new_tokens=2, do_sample=False)
    with pytest.raises(pipeline.InputError, match="over the written cache positions only it") as raised:
        pipeline.convert(model, inputs, generation=GENERATION, validate=False)
    message = str(raised.value)
    assert "_StorageReadingGPTNeo's decoder step over a static cache" in message
    assert "at the prompt's last token" in message and "max difference" in message
    assert raised.value.fix
