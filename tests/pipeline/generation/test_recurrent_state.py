"""generation= for models whose cache layers keep a recurrent state (pipeline/generation/recurrent_state.py).

A tiny LFM2 (a short-convolution layer, then an attention layer) converted for real on ONNX Runtime fp32: the step
takes ``past_key_values.0.conv`` beside layer 1's keys and values, one token at a time, its prompt graph 12 tokens per
run (pipeline/generation/prompt_graph.py), and a left-padded batch decodes as transformers' ``model.generate`` (tokens
and every step's scores), with beams, saved and loaded; the real TensorRT-RTX builder takes both graphs (the module is
converted for it when it is installed: the same graphs run on ONNX Runtime beside the engines, which cannot run
here).
"""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path

import pytest
import torch
import transformers
from tiny_models import answers_from_threads, mixed_requests

import pipeline
from pipeline.runtime.executors import EngineNotRunnableWarning
from pipeline.runtime.generation.module import GenerativeModule

RTX = importlib.util.find_spec("tensorrt_rtx") is not None
BACKEND = {"backend": "tensorrt-rtx", "trt_engine_cache": False} if RTX else {}
NEW_TOKENS = 8
GENERATION = {"max_length": 24, "max_batch": 8}


def tiny_lfm2() -> transformers.Lfm2ForCausalLM:
    torch.manual_seed(0)
    config = transformers.Lfm2Config(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        layer_types=["conv", "full_attention"],
        eos_token_id=95,
        pad_token_id=0,
    )
    return transformers.Lfm2ForCausalLM(config).eval()


@pytest.fixture(scope="module")
def model() -> transformers.Lfm2ForCausalLM:
    return tiny_lfm2()


@pytest.fixture(scope="module")
def prompts() -> tuple[torch.Tensor, torch.Tensor]:
    """Two prompts of 7 and 4 tokens, the second left-padded."""
    ids = torch.randint(3, 90, (2, 7), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    ids[1, :3], mask[1, :3] = 0, 0
    return ids, mask


@pytest.fixture(scope="module")
def module(model: transformers.Lfm2ForCausalLM, prompts: tuple[torch.Tensor, torch.Tensor]) -> GenerativeModule:
    """Converted for TensorRT-RTX when it is installed (the real builder builds the engine; with no GPU here the
    steps run on ONNX Runtime beside it, the same graph), else for ONNX Runtime: one export for both checks."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EngineNotRunnableWarning)
        converted = pipeline.convert(model, prompts[0], generation=GENERATION, validate=False, **BACKEND)
    assert isinstance(converted, GenerativeModule)
    return converted


def test_the_step_carries_the_convolution_state_one_token_at_a_time(module: GenerativeModule) -> None:
    inputs = [spec.name for spec in module.io.inputs]
    assert inputs[4:] == ["past_key_values.0.conv", "past_key_values.1.key", "past_key_values.1.value"]
    assert "present.0.conv" in [spec.name for spec in module.io.outputs]
    assert module.generation.layers == 2 and module.generation.max_prompt == 1
    # the prompt runs on a graph of its own: the step's inputs, half the capacity of tokens per run
    assert module.generation.prompt_tokens == 12 and module.prompt_graph is not None
    prompt_inputs = [(spec.name, spec.shape) for spec in module.prompt_graph.io.inputs]
    assert [name for name, _ in prompt_inputs] == inputs and prompt_inputs[0][1][1] == 12


def test_a_padded_batch_decodes_as_transformers_does(
    model: transformers.Lfm2ForCausalLM, module: GenerativeModule, prompts: tuple[torch.Tensor, torch.Tensor]
) -> None:
    ids, mask = prompts
    options = {"max_new_tokens": NEW_TOKENS, "output_scores": True, "return_dict_in_generate": True}
    expected = model.generate(ids, attention_mask=mask, do_sample=False, eos_token_id=None, **options)
    got = module.generate(ids, attention_mask=mask, eos_token_id=[], **options)
    assert torch.equal(got.sequences, expected.sequences)
    assert len(got.scores) == NEW_TOKENS
    for ours, theirs in zip(got.scores, expected.scores, strict=True):
        torch.testing.assert_close(ours, theirs, atol=1e-3, rtol=1e-3)


def test_beams_and_a_saved_step_decode_as_transformers_does(
    model: transformers.Lfm2ForCausalLM,
    module: GenerativeModule,
    prompts: tuple[torch.Tensor, torch.Tensor],
    tmp_path: Path,
) -> None:
    ids, mask = prompts
    beams = model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, num_beams=4, do_sample=False)
    assert torch.equal(module.generate(ids, mask, max_new_tokens=NEW_TOKENS, num_beams=4, eos_token_id=[95]), beams)
    module.save(tmp_path / "lfm2")
    loaded = pipeline.load(tmp_path / "lfm2")
    assert isinstance(loaded, GenerativeModule) and loaded.prompt_graph is not None
    greedy = model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None)
    assert torch.equal(loaded.generate(ids, mask, max_new_tokens=NEW_TOKENS, eos_token_id=[]), greedy)


def test_requests_from_threads_at_once_answer_as_alone(
    module: GenerativeModule, prompts: tuple[torch.Tensor, torch.Tensor]
) -> None:
    """A server's use of a module with a prompt graph: greedy, beams, one row, sampling and a stream from 6 threads at
    once, each request's prompt runs on the prompt graph's session and its steps on the step's, over its own slot's
    buffers; every answer as alone."""
    ids, mask = prompts
    assert answers_from_threads(mixed_requests(module, {"input_ids": ids, "attention_mask": mask})) == []


def test_a_prompt_whose_padding_leaves_no_room_runs_its_leading_tokens_one_at_a_time(
    model: transformers.Lfm2ForCausalLM, module: GenerativeModule, prompts: tuple[torch.Tensor, torch.Tensor]
) -> None:
    """7 tokens padded to a run of 12 leave 12 positions; 17 new tokens need 17: the 7 go one at a time."""
    from pipeline.runtime.generation.feed import prompt_padding, prompt_runs

    assert prompt_padding(7, 24, 12, 8) == 5 and prompt_padding(7, 24, 12, 17) == 0
    assert prompt_runs(7, 1, 12) == [(i, i + 1) for i in range(7)] and prompt_runs(12, 1, 12) == [(0, 12)]
    ids, mask = prompts
    expected = model.generate(ids, attention_mask=mask, max_new_tokens=17, do_sample=False, eos_token_id=None)
    assert torch.equal(module.generate(ids, mask, max_new_tokens=17, eos_token_id=[]), expected)


def test_max_prompt_sets_the_prompt_graph_and_one_asks_for_none(model: transformers.Lfm2ForCausalLM) -> None:
    from converters.generation_settings import GenerationSettings
    from pipeline.generation.conversion import one_token_prompt

    def tokens(**given: int) -> int:
        return one_token_prompt(model, GenerationSettings(**{**GENERATION, **given})).prompt_tokens

    assert tokens() == 12 and tokens(max_prompt=4) == 4 and tokens(max_prompt=1) == 0
    assert tokens(max_length=300) == 64  # PROMPT_TOKENS
    with pytest.warns(UserWarning, match="leaves no room for a prompt graph"):
        assert tokens(max_length=3) == 0
    with pytest.warns(UserWarning, match=r"not the max_prompt=4 asked for: this kind of model has no prompt graph"):
        one_token_prompt(model, GenerationSettings(**{**GENERATION, "max_prompt": 4}), prompt_graph=False)


def test_layers_a_step_cannot_cache_are_refused_by_kind() -> None:
    from pipeline.generation.conversion import check_attention_layers

    model = tiny_lfm2()
    check_attention_layers(model, states=True)  # conv layers: cached
    with pytest.raises(pipeline.InputError, match="layers of kind conv"):
        check_attention_layers(model)  # a step that caches keys and values only (vision-language decoders)
    model.config.layer_types = ["indexed_attention", "full_attention"]
    check_attention_layers(model, states=True)  # an indexer's keys: cached by the decoder-only steps
    with pytest.raises(pipeline.InputError, match="(?s)layers of kind indexed_attention.*without generation="):
        check_attention_layers(model)  # not by a step that caches keys and values only
    model.config.layer_types = ["rwkv", "full_attention"]
    with pytest.raises(pipeline.InputError, match="(?s)layers of kind rwkv.*without generation="):
        check_attention_layers(model, states=True)


@pytest.mark.skipif(not RTX, reason="TensorRT-RTX is not installed")
def test_tensorrt_rtx_builds_the_step_and_the_prompt_graph(module: GenerativeModule) -> None:
    """One engine of one profile (the step takes one token), fp32 attention decomposed (no fp32 ONNX Attention
    kernel in TensorRT-RTX), built by the real builder; no part left to ONNX Runtime segments; the prompt graph's
    engine beside it."""
    assert module.engine_bytes and not getattr(module, "segments", None)
    assert module.generation.attention == "decomposed" and len(module.settings.profiles) <= 1
    assert module.prompt_graph is not None and module.prompt_graph.engine_bytes  # the prompt graph's own engine


@pytest.mark.skipif(not RTX, reason="TensorRT-RTX is not installed")
def test_tensorrt_rtx_builds_both_graphs_in_fp16_and_they_decode_as_transformers(
    model: transformers.Lfm2ForCausalLM, prompts: tuple[torch.Tensor, torch.Tensor]
) -> None:
    """fp16 is written into both graphs (TensorRT-RTX is strongly typed) and the real builder builds each; the same
    graphs, run here on ONNX Runtime, give transformers' fp32 greedy tokens (the prompt as one run of the graph)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EngineNotRunnableWarning)
        converted = pipeline.convert(
            model, prompts[0], generation=GENERATION, precision="fp16", validate=False, **BACKEND
        )
    assert isinstance(converted, GenerativeModule) and converted.prompt_graph is not None
    assert converted.run_tokens == GENERATION["max_length"] // 2  # the default: at most half the cache
    for graph in (converted, converted.prompt_graph):
        assert graph.engine_bytes
        assert graph.report.precision is not None and graph.report.precision.dtype == "float16"
        assert graph.report.precision.share == 1.0  # every matmul's FLOPs in float16
    ids, mask = prompts
    expected = model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False)
    assert torch.equal(converted.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS), expected)


def test_a_model_of_recurrent_layers_alone_is_handed_an_empty_cache_first() -> None:
    """Bamba's small config (the every-type source's) keeps two Mamba-2 layers and no attention layer: its forward
    called with no cache asks an attention layer for the cache's length and raises. The conversion hands it an empty
    cache, as ``generate`` does; greedy tokens on a left-padded batch as transformers'."""
    from model_sources import transformers_all_models as every

    bamba, _ = every.build("bamba", "BambaForCausalLM")
    bamba = bamba.eval()
    assert "attention" not in bamba.config.layer_types
    ids = torch.randint(3, 90, (2, 9), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    ids[1, :2], mask[1, :2] = 0, 0
    generation = {"max_length": 24, "max_batch": 2, "max_prompt": 1}
    module = pipeline.convert(bamba, ids, generation=generation, validate=False)
    expected = bamba.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False, eos_token_id=None)
    assert torch.equal(module.generate(ids, mask, max_new_tokens=8, eos_token_id=[]), expected)


def test_a_layout_of_states_gives_each_state_its_own_output_buffer() -> None:
    """Keys and values are written in place; a state is replaced, so its present output is another buffer."""
    from pipeline.runtime.generation.layout import CacheLayout

    names = (
        "past_key_values.0.conv",
        "past_key_values.0.recurrent",
        "past_key_values.2.key",
        "past_key_values.2.value",
    )
    layout = CacheLayout(names, ((8, 4), (2, 4, 4), (2, 16, 8), (2, 16, 8)), (torch.float32,) * 4)
    assert layout.in_place == (False, False, True, True)
    assert layout.present_names == tuple(n.replace("past_key_values", "present") for n in names)
    assert layout.layers == 2 and layout.capacity == 16  # layer 1 (an MLP layer) holds nothing
