"""A recurrent model's prompt graph (pipeline/generation/prompt_graph.py) on a tiny Nemotron-H whose time step the
chunked scan clamps: transformers runs a prompt through the chunked scan (dt clamped from below) and a decode step
through the one-token update (not clamped), so a prompt fed token by token decodes otherwise. Its prompt graph runs
the prompt through the chunked scan, in runs of 8 tokens from the states: greedy tokens, every step's scores and
4 beams as ``model.generate`` on a left-padded batch of 2 whose longer prompt takes two runs; validation (on by
default) decodes so too; saved and loaded; the real TensorRT-RTX builder builds both graphs when it is installed.
"""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path

import pytest
import torch
import transformers

import pipeline
from pipeline.runtime.executors import EngineNotRunnableWarning
from pipeline.runtime.generation.module import GenerativeModule

RTX = importlib.util.find_spec("tensorrt_rtx") is not None
BACKEND = {"backend": "tensorrt-rtx", "trt_engine_cache": False} if RTX else {}
NEW_TOKENS = 8
GENERATION = {"max_length": 40, "max_batch": 8, "max_prompt": 8}


@pytest.fixture(scope="module")
def model() -> transformers.NemotronHForCausalLM:
    torch.manual_seed(0)
    config = transformers.NemotronHConfig(
        vocab_size=128,
        hidden_size=64,
        num_hidden_layers=4,
        layer_types=["mamba", "attention", "mamba", "mlp"],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        mamba_num_heads=8,
        mamba_head_dim=16,
        ssm_state_size=16,
        n_groups=2,
        chunk_size=8,
        intermediate_size=128,
        eos_token_id=127,
        pad_token_id=0,
    )
    model = transformers.NemotronHForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            mixer = layer.mixer
            if hasattr(mixer, "dt_bias"):  # every head's time step below time_step_min (1e-3): the clamp bites
                mixer.dt_bias.copy_(torch.linspace(-20.0, -12.0, mixer.dt_bias.numel()))
                # the scan's inputs 100x (x, B, C): its output above the gated norm's eps, so that the mixer counts
                mixer.in_proj.weight[mixer.intermediate_size : mixer.intermediate_size + mixer.conv_dim].mul_(100.0)
    return model


@pytest.fixture(scope="module")
def prompts() -> tuple[torch.Tensor, torch.Tensor]:
    """Two prompts of 13 and 9 tokens, the second left-padded: padded to 16, two runs of 8."""
    ids = torch.randint(3, 120, (2, 13), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    ids[1, :4], mask[1, :4] = 0, 0
    return ids, mask


@pytest.fixture(scope="module")
def module(model: transformers.NemotronHForCausalLM, prompts: tuple[torch.Tensor, torch.Tensor]) -> GenerativeModule:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EngineNotRunnableWarning)
        converted = pipeline.convert(model, prompts[0], generation=GENERATION, **BACKEND)  # validated
    assert isinstance(converted, GenerativeModule)
    return converted


def test_the_clamp_makes_the_one_token_path_another_function(
    model: transformers.NemotronHForCausalLM, prompts: tuple[torch.Tensor, torch.Tensor]
) -> None:
    """What the prompt graph is for: transformers' own prompt fed token by token ends elsewhere than fed whole."""
    ids = prompts[0][:1]
    with torch.no_grad():
        whole = model(ids).logits[:, -1]
        cache = None
        for k in range(ids.shape[1]):
            out = model(ids[:, k : k + 1], cache=cache, use_cache=True)
            cache = out.past_key_values
    assert float((out.logits[:, -1] - whole).abs().max()) > 2e-3  # the scores' tolerance is 1e-3


def test_greedy_scores_and_beams_are_transformers(
    model: transformers.NemotronHForCausalLM, module: GenerativeModule, prompts: tuple[torch.Tensor, torch.Tensor]
) -> None:
    assert module.generation.prompt_tokens == 8 and module.prompt_graph is not None
    assert module.report.accuracy is not None and module.report.accuracy.decoding is not None
    ids, mask = prompts
    options = {"max_new_tokens": NEW_TOKENS, "output_scores": True, "return_dict_in_generate": True}
    expected = model.generate(ids, attention_mask=mask, do_sample=False, eos_token_id=None, **options)
    got = module.generate(ids, attention_mask=mask, eos_token_id=[], **options)
    assert torch.equal(got.sequences, expected.sequences)
    for ours, theirs in zip(got.scores, expected.scores, strict=True):
        torch.testing.assert_close(ours, theirs, atol=1e-3, rtol=1e-3)
    beams = model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, num_beams=4, do_sample=False)
    assert torch.equal(module.generate(ids, mask, max_new_tokens=NEW_TOKENS, num_beams=4, eos_token_id=[127]), beams)


def test_saved_and_loaded_with_its_prompt_graph(
    model: transformers.NemotronHForCausalLM,
    module: GenerativeModule,
    prompts: tuple[torch.Tensor, torch.Tensor],
    tmp_path: Path,
) -> None:
    ids, mask = prompts
    saved = module.save(tmp_path / "nemotron_h")
    assert sorted(p.name for p in saved.iterdir() if p.suffix == ".ptrt") == ["prompt.ptrt", "step.ptrt"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EngineNotRunnableWarning)
        loaded = pipeline.load(saved)
    assert isinstance(loaded, GenerativeModule) and loaded.prompt_graph is not None
    greedy = model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None)
    assert torch.equal(loaded.generate(ids, mask, max_new_tokens=NEW_TOKENS, eos_token_id=[]), greedy)
    written = module.save_onnx(tmp_path / "onnx" / "model.onnx")  # both graphs, for other tools
    assert {p.name for p in written} >= {"model.onnx", "model.prompt.onnx"}
    # served as one model: its step's settings, a prompt per request; the repository holds both artifacts
    from pipeline.serving.export import export_triton

    exported = export_triton(saved, tmp_path / "repository")
    held = {p.name for p in (tmp_path / "repository").rglob("*.ptrt")}
    assert [m.name for m in exported.models] == ["nemotron_h"] and held == {"step.ptrt", "prompt.ptrt"}


@pytest.mark.skipif(not RTX, reason="TensorRT-RTX is not installed")
def test_tensorrt_rtx_builds_both_graphs(module: GenerativeModule) -> None:
    assert module.engine_bytes and module.prompt_graph is not None and module.prompt_graph.engine_bytes


def test_a_model_whose_runs_do_not_continue_from_states_runs_only_a_first_run() -> None:
    """Mamba's selective scan starts from zero whatever its cache holds: a second run would forget the first. The
    conversion finds it by running the model (two runs against its own prefill), says so, and keeps the prompt graph
    for a prompt's first run only (from zero states: the model's own prefill), the tokens after it one at a time:
    a prompt of 5 tokens (padded to one run of 8) and one of 13 (a run of 8, then 5 steps) in a padded batch, and
    each alone, decode as transformers; validation (on) decodes so too."""
    from pipeline.runtime.generation.feed import prompt_padding, prompt_runs

    model, ids, mask = _mamba()
    with pytest.warns(UserWarning, match="does not continue from the states a run leaves.*first 8 tokens run on"):
        module = pipeline.convert(model, ids[:1], generation=MAMBA_GENERATION)
    assert isinstance(module, GenerativeModule)
    assert module.prompt_graph is not None and module.run_tokens == 8
    assert not module.generation.prompt_continues
    assert prompt_padding(13, 32, 8, 8, continues=False) == 0 and prompt_padding(5, 32, 8, 8, continues=False) == 3
    assert prompt_runs(13, 1, 8, continues=False) == [(0, 8)] + [(i, i + 1) for i in range(8, 13)]
    for rows in (slice(0, 2), slice(0, 1), slice(1, 2)):
        prompt, prompt_mask = ids[rows], mask[rows]
        if rows == slice(1, 2):  # the short prompt alone, unpadded
            prompt, prompt_mask = prompt[:, 8:], prompt_mask[:, 8:]
        options = {"max_new_tokens": NEW_TOKENS, "output_scores": True, "return_dict_in_generate": True}
        expected = model.generate(prompt, attention_mask=prompt_mask, do_sample=False, eos_token_id=None, **options)
        got = module.generate(prompt, prompt_mask, eos_token_id=[], **options)
        assert torch.equal(got.sequences, expected.sequences)
        # tight: a second run from the states (which Mamba's scan ignores) puts this tiny model's scores 4e-4 off
        for ours, theirs in zip(got.scores, expected.scores, strict=True):
            torch.testing.assert_close(ours, theirs, atol=2e-5, rtol=0)


MAMBA_GENERATION = {"max_length": 32, "max_batch": 2, "max_prompt": 8}


def _mamba() -> tuple[transformers.MambaForCausalLM, torch.Tensor, torch.Tensor]:
    """A tiny Mamba and two prompts of 13 and 5 tokens, the second left-padded."""
    torch.manual_seed(0)
    config = transformers.MambaConfig(vocab_size=96, hidden_size=32, num_hidden_layers=2, state_size=8, pad_token_id=0)
    model = transformers.MambaForCausalLM(config).eval()
    ids = torch.randint(3, 90, (2, 13), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    ids[1, :8], mask[1, :8] = 0, 0
    return model, ids, mask


@pytest.mark.skipif(not RTX, reason="TensorRT-RTX is not installed")
def test_tensorrt_rtx_builds_mambas_first_run_graph_and_step_in_fp16() -> None:
    """Mamba's first-run prompt graph and its step with fp16 written in: the real builder builds both; the same
    graphs on ONNX Runtime give transformers' fp32 greedy tokens on the padded batch."""
    model, ids, mask = _mamba()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the engine that cannot run here, the first-run notice (tested above)
        converted = pipeline.convert(
            model, ids[:1], generation=MAMBA_GENERATION, precision="fp16", validate=False, **BACKEND
        )
    assert isinstance(converted, GenerativeModule) and converted.prompt_graph is not None
    assert not converted.generation.prompt_continues and converted.run_tokens == 8
    for graph in (converted, converted.prompt_graph):
        assert graph.engine_bytes
        assert graph.report.precision is not None and graph.report.precision.dtype == "float16"
    expected = model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None)
    got = converted.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, eos_token_id=[])
    assert torch.equal(got, expected)
