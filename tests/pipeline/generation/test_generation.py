"""Generation: a transformers causal LM converted as one cached decoder step, decoded like ``model.generate``.

One tiny Llama (grouped KV heads) is converted once for the module; every test judges what a user compares:
tokens against transformers' own ``generate`` on the same weights (fp32, ONNX Runtime), the graph's cache form, the
decoding options, the artifact, and the errors.
"""

from __future__ import annotations

import collections
import dataclasses
from pathlib import Path

import pytest
import torch
import transformers
from tiny_models import tiny_llama

import pipeline
from converters.errors import AccuracyError, InputError
from pipeline.runtime.executors import EngineNotRunnableWarning
from pipeline.runtime.generation.module import GenerativeModule
from pipeline.settings import Settings

NEW_TOKENS = 32


@pytest.fixture(scope="module")
def llama() -> transformers.LlamaForCausalLM:
    return tiny_llama()


@pytest.fixture(scope="module")
def step(llama: transformers.LlamaForCausalLM) -> GenerativeModule:
    ids = torch.randint(1, 90, (1, 6), generator=torch.Generator().manual_seed(1))
    module = pipeline.convert(llama, ids, generation={"max_length": 48, "max_batch": 3}, validation_inputs=1)
    assert isinstance(module, GenerativeModule)
    return module


def left_padded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Three prompts of 9, 6 and 8 tokens, left-padded with the pad id 0."""
    ids = torch.randint(1, 90, (3, 9), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    mask[2, :1] = 0
    return ids.masked_fill(mask == 0, 0), mask


def eos_free(llama: transformers.LlamaForCausalLM) -> dict[str, object]:
    """transformers' generate without eos (so both run the full length): the options both sides get."""
    return {"max_new_tokens": NEW_TOKENS, "do_sample": False, "eos_token_id": None, "pad_token_id": 0}


def test_plain_forward_of_a_model_with_use_cache_converts(llama: transformers.LlamaForCausalLM) -> None:
    """use_cache=True in the config (the default): the plain forward converts, the cache output comes back None."""
    ids = torch.randint(1, 90, (2, 7))
    module = pipeline.convert(llama, ids, validation_inputs=1)
    out = module(ids)
    assert out.cache is None
    torch.testing.assert_close(out.logits, llama(ids).logits, rtol=1e-4, atol=1e-5)


def test_step_graph_holds_the_static_cache_form(step: GenerativeModule) -> None:
    graph = step.onnx.graph
    inputs = [i.name for i in graph.input]
    outputs = [o.name for o in graph.output]
    assert inputs[:4] == ["input_ids", "attention_mask", "position_ids", "past_length"]
    assert inputs[4:] == [f"past_key_values.{i}.{k}" for i in range(2) for k in ("key", "value")]
    assert outputs == ["logits"] + [f"present.{i}.{k}" for i in range(2) for k in ("key", "value")]
    ops = collections.Counter(n.op_type for n in graph.node)
    assert ops["TensorScatter"] == 4 and ops["Attention"] == 2
    # opset 24: RMSNorm (2 per layer and the final one) and RoPE (queries and keys per layer) as the opset-23 ops
    assert ops["RMSNormalization"] == 5 and ops["RotaryEmbedding"] == 4 and ops["Neg"] == 0
    assert step.report.fused_ops == {"RMSNormalization": 5, "RotaryEmbedding": 4}
    assert "fused     5 RMSNormalization, 4 RotaryEmbedding" in step.report.summary()
    shape = [d.dim_value or d.dim_param for d in graph.input[4].type.tensor_type.shape.dim]
    assert shape == ["batch", 2, 48, 16]  # KV heads stay grouped (2, not the 4 query heads)
    assert step.report.accuracy is not None and step.report.accuracy.passed


def test_validation_judges_whole_decodings_against_the_models_own_cache(step: GenerativeModule) -> None:
    """The conversion's validation decoded the sample and a left-padded batch of 3 drawn prompts (validation_inputs=1,
    but a padded batch always has 3 rows when max_batch allows) with transformers' own generate (DynamicCache) and
    judged the prefill and 8 decode steps' logits; the greedy count is reported, and its run gave the sample's judged
    logits (the same tokens)."""
    assert step.report.accuracy is not None
    decoding = step.report.accuracy.decoding
    assert decoding is not None and decoding.passed
    assert len(decoding.prompts) == 2
    assert decoding.prompts[0] == "sample 1x6" and decoding.prompts[1].startswith("left-padded 3x")
    lengths = [int(n) for n in decoding.prompts[1].split("drawn, ")[1].split(" tokens")[0].split("/")]
    assert len(set(lengths)) == 3 and decoding.prompts[1].startswith(f"left-padded 3x{max(lengths)} ")
    assert (decoding.rows, decoding.prompt_tokens, decoding.logits_judged) == (4, 6 + sum(lengths), 4 * 9)
    assert [s.step for s in decoding.per_step] == list(range(9))
    assert decoding.computed_in == "float32" and decoding.worst_step.max_abs < 1e-5
    assert (decoding.greedy, decoding.greedy_tokens, decoding.greedy_reused) == (16, 16, True)
    summary = step.report.summary()
    assert "decoding  PASS" in summary and "fp32: 16/16 greedy tokens identical to PyTorch fp32" in summary
    assert (
        f"on 4 prompts in 2 runs (sample 1x6, {decoding.prompts[1]}): {decoding.prompt_tokens} prompt tokens" in summary
    )
    loaded = type(step.report).from_dict(step.report.to_dict())
    assert loaded.accuracy is not None and loaded.accuracy.decoding == decoding


def test_decoding_validation_fails_a_perturbed_weight_and_a_wrong_mask(
    step: GenerativeModule, llama: transformers.LlamaForCausalLM
) -> None:
    """Planted errors: one weight of the graph 1% off, and a runner that drops the left padding from the mask
    (only the left-padded batch of drawn prompts can show it): both are AccuracyErrors of the decoding validation."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper

    from pipeline.generation.validation import validate_decoding
    from pipeline.runtime.generation.layout import cache_layout
    from pipeline.runtime.generation.runners import OrtBoundRunner

    graph = onnx.ModelProto()
    graph.CopyFrom(step.onnx)
    weight = [i for i in graph.graph.initializer if len(i.dims) == 2 and i.data_type == onnx.TensorProto.FLOAT][-3]
    weight.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(weight) * np.float32(1.01), weight.name))
    session = ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
    layout = cache_layout(step.io, step.generation.layers)
    ids = torch.randint(1, 90, (1, 6), generator=torch.Generator().manual_seed(1))
    short = dataclasses.replace(step.generation, validation_steps=2)  # a few steps show it: keep the test short
    settings = dataclasses.replace(step.settings, generation=short, validation_inputs=0)
    with pytest.raises(AccuracyError, match="decoding differs from PyTorch's own generate"):
        validate_decoding(llama, None, step.io, ids, settings, OrtBoundRunner(session, layout), greedy_tokens=1)

    class NoPadding:
        """The step's runner with every mask position written so far attended (left padding ignored)."""

        def __init__(self) -> None:
            self.runner = step.runner()

        def start(self, batch: int) -> None:
            self.runner.start(batch)

        def run(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, past: int) -> torch.Tensor:
            written = torch.arange(mask.shape[1]) < past + ids.shape[1]
            return self.runner.run(ids, mask | written.to(mask.dtype), positions, past)

    with pytest.raises(AccuracyError, match="decoding differs") as error:
        validate_decoding(llama, None, step.io, ids, settings, NoPadding(), greedy_tokens=1)
    assert "step 0" in str(error.value)
    single = dataclasses.replace(settings, generation=dataclasses.replace(short, max_batch=1))
    assert validate_decoding(llama, None, step.io, ids, single, NoPadding(), greedy_tokens=1).passed  # unseen


class CountingRunner:
    """The step's runner, recording each decoding run: its rows, its prompt width and its step calls."""

    def __init__(self, step: GenerativeModule, perturb_from: int | None = None) -> None:
        self.runner = step.runner()
        self.runs: list[list[int]] = []  # per run: [rows, width of the first call, calls]
        self.perturb_from = perturb_from  # from this call of the first run on, its logits are nudged

    def start(self, batch: int) -> None:
        self.runner.start(batch)
        self.runs.append([batch, 0, 0])

    def run(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, past: int) -> torch.Tensor:
        run = self.runs[-1]
        run[1] = run[1] or ids.shape[1]
        run[2] += 1
        logits = self.runner.run(ids, mask, positions, past)
        if self.perturb_from is not None and len(self.runs) == 1 and run[2] > self.perturb_from:
            logits = logits.clone()
            logits[:, 7] += 1e3  # the greedy choice becomes token 7 (teacher-forced runs feed PyTorch's tokens)
        return logits


def test_validation_decodes_the_sample_once_and_the_drawn_prompts_in_one_batch(
    step: GenerativeModule, llama: transformers.LlamaForCausalLM
) -> None:
    """The work the validation does, run by run: the sample decoded once (16 greedy tokens: its prefill and first
    8 steps are the judged teacher-forced ones), the drawn prompts in one left-padded batch (prefill and 8 steps);
    more drawn prompts than max_batch go in several batches, and max_batch=1 decodes each alone, unpadded."""
    from pipeline.generation.validation import validate_decoding

    ids = torch.randint(1, 90, (1, 6), generator=torch.Generator().manual_seed(1))
    runner = CountingRunner(step)
    report = validate_decoding(llama, None, step.io, ids, step.settings, runner)
    lengths = [int(n) for n in report.prompts[1].split("drawn, ")[1].split(" tokens")[0].split("/")]
    assert runner.runs == [[1, 6, 1 + 15], [3, max(lengths), 1 + 8]]
    assert report.greedy_reused and (report.greedy, report.greedy_tokens) == (16, 16)

    many = dataclasses.replace(step.settings, validation_inputs=5)
    runner = CountingRunner(step)
    report = validate_decoding(llama, None, step.io, ids, many, runner)
    assert [r[0] for r in runner.runs] == [1, 3, 2] and report.rows == 6 and report.logits_judged == 6 * 9
    assert report.prompts[2].startswith("left-padded 2x")
    widths = [int(p.split("x")[1].split(" ")[0]) for p in report.prompts[1:]]
    assert [r[1] for r in runner.runs[1:]] == widths and max(widths) <= 48 - 8  # room for the judged steps

    single = dataclasses.replace(
        step.settings, validation_inputs=2, generation=dataclasses.replace(step.generation, max_batch=1)
    )
    runner = CountingRunner(step)
    report = validate_decoding(llama, None, step.io, ids, single, runner)
    assert [r[0] for r in runner.runs] == [1, 1, 1] and all(p.startswith("drawn 1x") for p in report.prompts[1:])


def test_a_sample_that_diverges_within_the_judged_steps_is_decoded_again_fed_pytorchs_tokens(
    step: GenerativeModule, llama: transformers.LlamaForCausalLM
) -> None:
    """The greedy run stands for the teacher-forced one only while its tokens are PyTorch's: when its own choice
    departs at step 4 (planted in that run alone), the sample is decoded again fed PyTorch's tokens and the judged
    logits are that run's (exact: it passes); a departure after the judged steps is only counted."""
    from pipeline.generation.validation import validate_decoding

    ids = torch.randint(1, 90, (1, 6), generator=torch.Generator().manual_seed(1))
    settings = dataclasses.replace(step.settings, validation_inputs=0)
    early = CountingRunner(step, perturb_from=4)  # the first run's calls 5.. (steps 4..) choose token 7
    report = validate_decoding(llama, None, step.io, ids, settings, early)
    assert report.passed and not report.greedy_reused and report.first_divergence == 4 and report.greedy < 16
    assert [r[2] for r in early.runs] == [16, 9, 9]  # greedy, the sample again teacher-forced, the drawn batch
    assert "(the same run gave" not in report.greedy_line()
    late = CountingRunner(step, perturb_from=12)  # beyond the prefill and 8 judged steps: only the count shows it
    report = validate_decoding(llama, None, step.io, ids, settings, late)
    assert report.passed and report.greedy_reused and report.first_divergence == 12 and report.greedy < 16
    assert [r[2] for r in late.runs] == [16, 9]


def test_greedy_is_token_identical_to_transformers(
    step: GenerativeModule, llama: transformers.LlamaForCausalLM
) -> None:
    ids = torch.randint(1, 90, (1, 5), generator=torch.Generator().manual_seed(3))
    expected = llama.generate(ids, **eos_free(llama))
    got = step.generate(ids, max_new_tokens=NEW_TOKENS, eos_token_id=[])
    assert got.shape == (1, 5 + NEW_TOKENS)
    assert torch.equal(got, expected)


def test_left_padded_batch_is_token_identical(step: GenerativeModule, llama: transformers.LlamaForCausalLM) -> None:
    ids, mask = left_padded_batch()
    expected = llama.generate(ids, attention_mask=mask, **eos_free(llama))
    got = step.generate(ids, mask, max_new_tokens=NEW_TOKENS, eos_token_id=[])
    assert torch.equal(got, expected)


def test_repetition_penalty_and_eos_as_transformers(
    step: GenerativeModule, llama: transformers.LlamaForCausalLM
) -> None:
    ids, mask = left_padded_batch()
    greedy = step.generate(ids, mask, max_new_tokens=8, eos_token_id=[])
    stop = int(greedy[0, 9 + 2])  # row 0's third new token: row 0 stops there, the others go on
    options = {"max_new_tokens": 12, "repetition_penalty": 1.5, "eos_token_id": stop, "pad_token_id": 0}
    expected = llama.generate(ids, attention_mask=mask, do_sample=False, **options)
    got = step.generate(ids, mask, **options)
    assert torch.equal(got, expected)


def test_sampling_is_seeded_and_filtered(step: GenerativeModule) -> None:
    ids = torch.randint(1, 90, (2, 4), generator=torch.Generator().manual_seed(4))
    options = {"max_new_tokens": 10, "do_sample": True, "temperature": 0.8, "top_p": 0.9, "eos_token_id": []}
    first = step.generate(ids, seed=7, **options)
    assert torch.equal(first, step.generate(ids, seed=7, **options))
    assert not torch.equal(first, step.generate(ids, seed=8, **options))
    greedy = step.generate(ids, max_new_tokens=10, eos_token_id=[])
    assert torch.equal(step.generate(ids, max_new_tokens=10, do_sample=True, top_k=1, seed=3, eos_token_id=[]), greedy)


def test_sampled_tokens_are_transformers_own_under_the_same_seed(
    step: GenerativeModule, llama: transformers.LlamaForCausalLM
) -> None:
    """A user moving from ``model.generate(do_sample=True)`` after ``torch.manual_seed(s)`` expects ``seed=s`` to give
    the same tokens: the same processors in the same order (repetition penalty, temperature, top-k, top-p) and the same
    draw (one multinomial per step over the batch), on a plain and a left-padded batch."""
    options = {"do_sample": True, "top_k": 20, "top_p": 0.9, "temperature": 0.8, "repetition_penalty": 1.1}
    plain = torch.randint(1, 90, (2, 5), generator=torch.Generator().manual_seed(9))
    for ids, mask in ((plain, torch.ones_like(plain)), left_padded_batch()):
        for seed in range(3):
            torch.manual_seed(seed)
            theirs = llama.generate(
                ids, attention_mask=mask, max_new_tokens=12, eos_token_id=None, pad_token_id=0, **options
            )
            ours = step.generate(ids, mask, max_new_tokens=12, seed=seed, eos_token_id=[], pad_token_id=0, **options)
            assert torch.equal(ours, theirs), (seed, ours, theirs)


def test_stream_yields_the_generated_tokens(step: GenerativeModule) -> None:
    ids = torch.randint(1, 90, (1, 4), generator=torch.Generator().manual_seed(5))
    streamed = list(step.stream(ids, max_new_tokens=6, eos_token_id=[]))
    assert len(streamed) == 6 and all(t.shape == (1,) for t in streamed)
    assert torch.equal(
        torch.cat([ids, torch.stack(streamed, 1)], 1), step.generate(ids, max_new_tokens=6, eos_token_id=[])
    )


def test_saved_artifact_generates_the_same(step: GenerativeModule, tmp_path: Path) -> None:
    ids, mask = left_padded_batch()
    loaded = pipeline.load(step.save(tmp_path / "llama.ptrt"))
    assert isinstance(loaded, GenerativeModule)
    assert loaded.generation == step.generation
    assert torch.equal(loaded.generate(ids, mask, max_new_tokens=8), step.generate(ids, mask, max_new_tokens=8))


def test_capacity_and_batch_errors_say_the_fix(step: GenerativeModule) -> None:
    with pytest.raises(InputError, match="max_length=48"):
        step.generate(torch.ones(1, 40, dtype=torch.int64), max_new_tokens=9)
    with pytest.raises(InputError, match="max_batch=3"):
        step.generate(torch.ones(4, 3, dtype=torch.int64), max_new_tokens=2)
    with pytest.raises(InputError, match="left padding"):
        step.generate(torch.ones(1, 3, dtype=torch.int64), torch.tensor([[1, 1, 0]]), max_new_tokens=2)
    with pytest.raises(InputError, match="leaves no room in the cache"):
        step.generate(torch.ones(1, 48, dtype=torch.int64), max_new_tokens=2)
    with pytest.raises(InputError, match="prompt is empty"):
        step.generate(torch.ones(1, 0, dtype=torch.int64), max_new_tokens=2)
    with pytest.raises(InputError, match=r"token id\(s\) \[-1, 96\] outside the model's vocabulary \[0, 96\)"):
        step.generate(torch.tensor([[5, 96, -1]]), max_new_tokens=2)
    # an all-padding row is said as such (not blamed on padding at the end); a negative length is not "nothing to do"
    with pytest.raises(InputError, match=r"row\(s\) \[1\] are all zeros"):
        step.generate(torch.ones(2, 3, dtype=torch.int64), torch.tensor([[1, 1, 1], [0, 0, 0]]), max_new_tokens=2)
    with pytest.raises(InputError, match="max_new_tokens must be a positive int, got -3"):
        step.generate(torch.ones(1, 3, dtype=torch.int64), max_new_tokens=-3)
    with pytest.raises(InputError, match="max_length must be a positive int, got 2.5"):
        step.generate(torch.ones(1, 3, dtype=torch.int64), max_length=2.5)
    with pytest.raises(InputError, match="input_ids is a meta tensor"):
        step.generate(torch.ones(1, 3, dtype=torch.int64, device="meta"), max_new_tokens=2)
    with pytest.raises(InputError, match="attention_mask is a list, not a tensor"):
        step.generate(torch.ones(1, 3, dtype=torch.int64), [[1, 1, 1]], max_new_tokens=2)


def test_opt_learned_positions_decode_token_identically() -> None:
    """OPT: learned positions with an offset of 2, its query scaled before attention (scaling=1.0), its mask built
    without position ids; and transformers' generate falls back to the config's eos 2 unless the generation config
    drops it (what made OPT look divergent in the family table before)."""
    config = transformers.OPTConfig(
        vocab_size=96, hidden_size=32, ffn_dim=64, num_hidden_layers=1, num_attention_heads=2,
        word_embed_proj_dim=32, max_position_embeddings=64, pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.OPTForCausalLM(config).eval()
    model.generation_config.eos_token_id = None
    ids, mask = left_padded_batch()
    module = pipeline.convert(model, ids[:1], generation={"max_length": 32, "max_batch": 3}, validate=False)
    expected = model.generate(ids, attention_mask=mask, max_new_tokens=16, do_sample=False, pad_token_id=0)
    assert torch.equal(module.generate(ids, mask, max_new_tokens=16, eos_token_id=[]), expected)


def test_tensorrt_rtx_builds_the_fp16_step_with_two_profiles(llama: transformers.LlamaForCausalLM) -> None:
    """The real TensorRT-RTX builder: one engine, a context and a generation profile, ONNX Attention in fp16 over
    float16 cache inputs (a cast between the cache input and TensorScatter is refused by TensorRT). The fp16 graph
    is validated on ONNX Runtime beside the engine: every decoding step's logits judged as float16 (magnitude-
    relative, anchored to PyTorch's own half error where the fixed tolerance fails), the greedy tokens counted
    against PyTorch fp32 generate."""
    from pipeline.precision.buildable import rtx_available

    if not rtx_available():
        pytest.skip("TensorRT-RTX is not installed")
    ids = torch.randint(1, 90, (1, 6))
    generation = {"max_length": 32, "max_batch": 2, "max_prompt": 16}
    with pytest.warns(EngineNotRunnableWarning):
        module = pipeline.convert(
            llama,
            ids,
            generation=generation,
            precision="fp16",
            backend="tensorrt-rtx",
            validation_inputs=1,
            trt_engine_cache=False,
        )
    assert module.engine_bytes
    assert module.report.accuracy is not None
    decoding = module.report.accuracy.decoding
    assert decoding is not None and decoding.passed and decoding.computed_in == "float16"
    assert decoding.tolerance["rms"] > 0  # the low-precision rule, not float32's
    assert decoding.greedy >= 14 and decoding.greedy_tokens == 16
    assert f"fp16: {decoding.greedy}/16 greedy tokens identical to PyTorch fp32" in module.report.summary()
    assert [[(r.name, r.min, r.opt, r.max) for r in p] for p in module.settings.profiles] == [
        [("sequence", 1, 16, 16)],
        [("sequence", 1, 1, 1)],
    ]
    graph = module.onnx.graph
    assert sum(n.op_type == "Attention" for n in graph.node) == 2
    assert module.report.fused_ops == {"RMSNormalization": 5, "RotaryEmbedding": 4}  # built by TensorRT-RTX too
    assert graph.input[4].type.tensor_type.elem_type == 10  # float16 cache
    out = module.generate(ids, max_new_tokens=4)  # the same graph on ONNX Runtime beside the engine
    assert out.shape == (1, 10)


def test_profiles_setting_is_checked_against_the_declared_range() -> None:
    dynamic = {"x": {1: ("sequence", 1, 8, 64)}}
    settings = Settings(dynamic=dynamic, profiles=[{"sequence": (1, 32, 64)}, {"sequence": (1, 1, 1)}])
    assert [p[0].max for p in settings.profiles] == [64, 1]
    with pytest.raises(InputError, match="within the declared"):
        Settings(dynamic=dynamic, profiles=[{"sequence": (1, 8, 128)}])
    with pytest.raises(InputError, match="does not declare"):
        Settings(dynamic=dynamic, profiles=[{"batch": (1, 1, 1)}])
