"""The ONNX Runtime session graph of a cached step: GroupQueryAttention over the filled part of the cache.

A converted step's ``module.onnx`` keeps ONNX ``TensorScatter`` + ``Attention`` (TensorRT's graph); the ONNX Runtime
session runs each layer's pair of writes and attention as ``com.microsoft::GroupQueryAttention``
(``pipeline.runtime.ort.grouped_attention``). These tests run the real step of a tiny Llama through both graphs.
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tiny_models
import torch
import transformers

import pipeline
from pipeline.runtime.generation.layout import cache_layout
from pipeline.runtime.generation.module import GenerativeModule
from pipeline.runtime.generation.runners import OrtBoundRunner
from pipeline.runtime.ort.executor import OnnxRuntimeExecutor, row_session_wanted
from pipeline.runtime.ort.grouped_attention import grouped_attention_graph
from pipeline.runtime.ort.projections import split_projections
from pipeline.runtime.ort.session_graph import runnable_model

CAPACITY = 40


def tiny_llama() -> transformers.LlamaForCausalLM:
    return tiny_models.tiny_llama(seed=3, eos_token_id=2, pad_token_id=None)


@pytest.fixture(scope="module")
def llama() -> transformers.LlamaForCausalLM:
    return tiny_llama()


@pytest.fixture(scope="module")
def step(llama: transformers.LlamaForCausalLM) -> GenerativeModule:
    ids = torch.randint(1, 90, (1, 5), generator=torch.Generator().manual_seed(1))
    module = pipeline.convert(llama, ids, generation={"max_length": CAPACITY, "max_batch": 3}, validation_inputs=1)
    assert isinstance(module, GenerativeModule)
    return module


def ops(model: onnx.ModelProto) -> collections.Counter[str]:
    return collections.Counter(n.op_type for n in model.graph.node)


def bound_runner(step: GenerativeModule, model: onnx.ModelProto) -> OrtBoundRunner:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return OrtBoundRunner(session, cache_layout(step.io, step.generation.layers))


def test_session_runs_group_query_attention_and_module_onnx_stays_standard(step: GenerativeModule) -> None:
    session_graph = runnable_model(step.onnx, "onnxruntime", step.settings)
    assert ops(session_graph)["GroupQueryAttention"] == 2  # one per layer
    assert ops(session_graph)["TensorScatter"] == 0 and ops(session_graph)["Attention"] == 0
    assert ops(step.onnx)["TensorScatter"] == 4 and ops(step.onnx)["Attention"] == 2  # TensorRT's graph
    assert all(o.domain != "com.microsoft" for o in step.onnx.opset_import)
    off = dataclasses.replace(step.settings, ort_grouped_attention=False)
    assert ops(runnable_model(step.onnx, "onnxruntime", off))["GroupQueryAttention"] == 0
    on_gpu = dataclasses.replace(step.settings, ort_providers=("CUDAExecutionProvider", "CPUExecutionProvider"))
    assert ops(runnable_model(step.onnx, "onnxruntime", on_gpu))["GroupQueryAttention"] == 0


def test_the_kernel_rotates_the_projections_itself_and_feeds_the_output_projection_directly(
    step: GenerativeModule,
) -> None:
    """No head split and merge around the kernel, and no rotation before it (ONNX Runtime GenAI's form): its query,
    key and value are the q/k/v projection's parts as they are ([batch, steps, heads * dim]), and the kernel rotates
    queries and keys itself (do_rotary) at the step's position_ids, each row's new tokens given (query_seqlens),
    over one pair of cos/sin tables of every cache position; its output is what o_proj's MatMul reads (the model's
    Reshape/Transpose pairs and RotaryEmbedding nodes are gone). The float32 projection stays merged with its Split
    in the session graph: the prepacked session runs its parts as three MatMuls, whose outputs the kernel reads, and
    then no Split is left."""
    graph = runnable_model(step.onnx, "onnxruntime", step.settings).graph
    producers = {o: n for n in graph.node for o in n.output}
    readers = collections.defaultdict(list)
    for node in graph.node:
        for name in node.input:
            readers[name].append(node)
    gqas = [n for n in graph.node if n.op_type == "GroupQueryAttention"]
    assert len(gqas) == 2
    for gqa in gqas:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in gqa.attribute}
        split = producers[gqa.input[0]]
        assert split.op_type == "Split" and list(split.output) == list(gqa.input[:3])
        assert attrs["do_rotary"] == 1 and "rotary_interleaved" not in attrs
        assert gqa.input[9] == "position_ids" and "ort_gqa/query_seqlens" in gqa.input
        assert gqa.input[7:9] == ["ort_gqa/rotary0/cos_cache", "ort_gqa/rotary0/sin_cache"]
        assert [r.op_type for r in readers[gqa.output[0]]] == ["MatMul"]
    assert not [n for n in graph.node if n.op_type in ("RotaryEmbedding", "Transpose")]
    prepacked = split_projections(runnable_model(step.onnx, "onnxruntime", step.settings)).graph
    producers = {o: n for n in prepacked.node for o in n.output}
    weights = {i.name for i in prepacked.initializer}
    assert not [n for n in prepacked.node if n.op_type == "RotaryEmbedding"]
    assert not [n for n in prepacked.node if n.op_type == "Split" and n.input[0] not in weights]  # weights' only
    for gqa in (n for n in prepacked.node if n.op_type == "GroupQueryAttention"):
        assert [producers[name].op_type for name in gqa.input[:3]] == ["MatMul"] * 3


def test_the_kernels_rotation_gives_the_logits_of_the_rotation_before_it(step: GenerativeModule) -> None:
    """The kernel's own rotation against the session graph before it (``fused=False``: the model's RotaryEmbedding
    nodes before the kernel), both over the same merged projections:
    the same logits, bit for bit, and so the same tokens, for a left-padded batch of two (the first row padded too:
    the kernel without query_seqlens would rotate a prompt at its first row's first position, 1, plus the step),
    through the prompt and greedy decoding, and a single row's prompt in two chunks."""
    fused = grouped_attention_graph(step.onnx)
    apart = grouped_attention_graph(step.onnx, fused=False)
    assert ops(fused)["RotaryEmbedding"] == 0 and ops(apart)["RotaryEmbedding"] == 4
    batch, prompt = 2, 8
    ids = torch.randint(1, 90, (batch, prompt), generator=torch.Generator().manual_seed(17))
    mask = torch.zeros(batch, CAPACITY, dtype=torch.int64)
    mask[:, :prompt] = 1
    mask[0, :2] = 0
    mask[1, :5] = 0
    positions = (mask[:, :prompt].cumsum(-1) - 1).masked_fill(mask[:, :prompt] == 0, 1)
    runners = [bound_runner(step, graph) for graph in (fused, apart)]
    for runner in runners:
        runner.start(batch)
    logits = [runner.run(ids, mask, positions, 0) for runner in runners]
    nxt = positions[:, -1:] + 1
    for i in range(CAPACITY - prompt - 1):
        assert torch.equal(logits[0], logits[1]), f"step {i}"
        token = logits[1].argmax(-1)[:, None]
        mask[:, prompt + i] = 1
        logits = [runner.run(token, mask, nxt, prompt + i) for runner in runners]
        nxt = nxt + 1
    assert torch.equal(logits[0], logits[1])
    single = torch.ones(1, CAPACITY, dtype=torch.int64)
    for runner in runners:
        runner.start(1)
    chunks = [(ids[:1, :5], torch.arange(5)[None], 0), (ids[:1, 5:], torch.arange(5, prompt)[None], 5)]
    for chunk, at, past in chunks:
        logits = [runner.run(chunk, single, at, past) for runner in runners]
        assert torch.equal(logits[0], logits[1])


def test_residual_sums_and_their_norms_run_as_one_kernel(step: GenerativeModule) -> None:
    """Each residual Add and the RMSNormalization of its sum (two per layer) are one SkipSimplifiedLayerNormalization,
    whose sum output feeds the next residual; only the first norm (of the embeddings: no Add) stays. The numbers are
    the standard graph's (the other tests compare the two)."""
    graph = runnable_model(step.onnx, "onnxruntime", step.settings)
    counts = ops(graph)
    assert counts["SkipSimplifiedLayerNormalization"] == 4 and counts["RMSNormalization"] == 1
    fused = [n for n in graph.graph.node if n.op_type == "SkipSimplifiedLayerNormalization"]
    assert all(n.domain == "com.microsoft" for n in fused)
    readers = {name for n in graph.graph.node for name in n.input}
    assert [len(n.output) == 4 and n.output[3] in readers for n in fused] == [True, True, True, False]


def test_the_kernels_lengths_take_few_nodes(step: GenerativeModule) -> None:
    """The kernel's lengths made from ``past_length`` with one cast to int32: seven nodes a step (and two
    constants), and two more for each row's new tokens (``query_seqlens``, which its rotation needs)."""
    graph = runnable_model(step.onnx, "onnxruntime", step.settings).graph
    lengths = [n.op_type for n in graph.node if n.name.startswith("ort_gqa/") and "/" not in n.name[len("ort_gqa/") :]]
    assert sorted(lengths) == [
        *["Add", "Cast", "Cast", "Constant", "Constant", "Expand", "Expand", "Reshape", "Shape", "Shape", "Sub"]
    ]


def test_the_step_reads_only_the_filled_part_of_the_cache(step: GenerativeModule) -> None:
    """NaN past the filled positions: the whole-capacity Attention turns the logits NaN (0 * NaN in the weighted sum),
    GroupQueryAttention never reads there, and both agree on the real positions."""
    grouped = bound_runner(step, grouped_attention_graph(step.onnx))
    standard = bound_runner(step, step.onnx)
    ids = torch.randint(1, 90, (2, 6), generator=torch.Generator().manual_seed(5))
    mask = torch.zeros(2, CAPACITY, dtype=torch.int64)
    mask[:, :6] = 1
    positions = torch.arange(6).expand(2, 6)
    results = []
    for runner in (grouped, standard):
        runner.start(2)
        for array in runner.read_arrays:
            array[:, :, 6:] = np.nan
        results.append(runner.run(ids, mask, positions, 0))
    assert torch.isfinite(results[0]).all()
    assert torch.isnan(results[1]).any()
    clean = bound_runner(step, step.onnx)
    clean.start(2)
    torch.testing.assert_close(results[0], clean.run(ids, mask, positions, 0), rtol=1e-5, atol=1e-5)


def test_left_padding_and_a_chunked_batched_prefill_match_the_standard_graph(step: GenerativeModule) -> None:
    """Left-padded rows, a prompt in two chunks over a batch of three (ONNX Runtime's kernel takes several new
    tokens over a past for one row only: the runner runs such a chunk row by row), then greedy decoding."""
    grouped = bound_runner(step, grouped_attention_graph(step.onnx))
    standard = bound_runner(step, step.onnx)
    batch, prompt = 3, 9
    ids = torch.randint(1, 90, (batch, prompt), generator=torch.Generator().manual_seed(7))
    mask = torch.zeros(batch, CAPACITY, dtype=torch.int64)
    mask[:, :prompt] = 1
    mask[1, :2] = 0
    mask[2, :5] = 0
    positions = (mask[:, :prompt].cumsum(-1) - 1).masked_fill(mask[:, :prompt] == 0, 1)
    grouped.start(batch)
    standard.start(batch)
    for start, end in ((0, 4), (4, prompt)):
        chunk = (ids[:, start:end], mask, positions[:, start:end], start)
        logits, expected = grouped.run(*chunk), standard.run(*chunk)
    nxt = positions[:, -1:] + 1
    for i in range(CAPACITY - prompt - 1):
        torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-5)
        token = expected.argmax(-1)
        assert torch.equal(logits.argmax(-1), token), f"step {i}"
        mask[:, prompt + i] = 1
        logits = grouped.run(token[:, None], mask, nxt, prompt + i)
        expected = standard.run(token[:, None], mask, nxt, prompt + i)
        nxt = nxt + 1


def test_generate_on_the_grouped_session_is_token_identical_to_transformers(
    step: GenerativeModule, llama: transformers.LlamaForCausalLM
) -> None:
    ids = torch.randint(1, 90, (2, 7), generator=torch.Generator().manual_seed(11))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    new = CAPACITY - ids.shape[1]
    expected = llama.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False, eos_token_id=None)
    assert torch.equal(step.generate(ids, attention_mask=mask, max_new_tokens=new, eos_token_id=[]), expected)


def test_single_row_decode_steps_run_on_the_unprepacked_session_with_the_same_numbers(
    step: GenerativeModule, llama: transformers.LlamaForCausalLM
) -> None:
    """With ``ort_row_session=True``, batch-1 decode steps run on the executor's second session (no weight
    prepacking); the prompt and batched steps on the first. Both sessions read and write the same cache buffers: a
    decode on the two-session runner gives the one-session runner's logits at every step, and generate gives
    transformers' tokens. Off by default (one session: faster with the split projections)."""
    assert step._executor.row_session() is None  # the default: one session
    on = dataclasses.replace(step.settings, ort_row_session=True)
    executor = OnnxRuntimeExecutor(step.onnx, step.io, on)
    row = executor.row_session()
    assert row is not None and row is not executor.session and executor.row_session() is row  # made once
    layout = cache_layout(step.io, step.generation.layers)
    both = OrtBoundRunner(executor.session, layout, row_session=executor.row_session)
    one = OrtBoundRunner(executor.session, layout)
    ids = torch.randint(1, 90, (1, 6), generator=torch.Generator().manual_seed(21))
    mask = torch.zeros(1, CAPACITY, dtype=torch.int64)
    mask[:, :6] = 1
    for runner in (both, one):
        runner.start(1)
    logits = [runner.run(ids, mask, torch.arange(6)[None], 0) for runner in (both, one)]
    for i in range(10):
        torch.testing.assert_close(logits[0], logits[1], rtol=1e-4, atol=1e-5)
        token = logits[1].argmax(-1)[:, None]
        mask[:, 6 + i] = 1
        logits = [runner.run(token, mask, torch.tensor([[6 + i]]), 6 + i) for runner in (both, one)]
    assert both._row_binding is not None and both._row_binding.session is row  # the decode steps ran there
    single = ids[:, :5]
    new = CAPACITY - 5
    expected = llama.generate(single, max_new_tokens=new, do_sample=False, eos_token_id=None)
    assert torch.equal(step.generate(single, max_new_tokens=new, eos_token_id=[]), expected)
    assert row_session_wanted(step.onnx, on) and not row_session_wanted(step.onnx, step.settings)


def test_the_one_prepacked_session_runs_the_projections_apart(
    step: GenerativeModule, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no row session (the default), the prepacked session still gets the merged q/k/v and gate/up projections
    apart (faster packed at batch 1 and 4); the merged form stays in module.onnx."""
    import pipeline.runtime.ort.projections as projections_module

    seen: list[int] = []
    real = projections_module.split_projections

    def counting(model: onnx.ModelProto) -> onnx.ModelProto:
        split = real(model)
        seen.append(ops(split)["MatMul"] - ops(model)["MatMul"])
        return split

    monkeypatch.setattr(projections_module, "split_projections", counting)
    executor = OnnxRuntimeExecutor(step.onnx, step.io, step.settings)
    assert executor.row_session() is None
    assert seen and seen[0] > 0  # more MatMuls: the merged ones apart
    assert any(n.op_type == "Split" for n in step.onnx.graph.node)


def test_calling_the_step_returns_the_whole_cache_as_module_onnx_does(step: GenerativeModule) -> None:
    """The plain call (no bound buffers) runs the grouped session graph and still returns ``present`` as
    ``TensorScatter`` gives it: the past everywhere, the new positions written."""
    generator = torch.Generator().manual_seed(13)
    batch, steps, past_length = 2, 3, 5
    mask = torch.zeros(batch, CAPACITY, dtype=torch.int64)
    mask[:, : past_length + steps] = 1
    layout = cache_layout(step.io, step.generation.layers)
    past = [torch.randn((batch, *shape), generator=generator) for shape in layout.shapes]
    inputs = [
        torch.randint(1, 90, (batch, steps), generator=generator),
        mask,
        torch.arange(past_length, past_length + steps).expand(batch, steps),
        torch.tensor(past_length),
        *past,
    ]
    out = step(*inputs)
    got = list(out.values()) if isinstance(out, dict) else list(out)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    standard = ort.InferenceSession(step.onnx.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [i.name for i in standard.get_inputs()]
    expected = standard.run(None, {n: t.numpy() for n, t in zip(names, inputs, strict=True)})
    for name, value, reference in zip([o.name for o in standard.get_outputs()], got, expected, strict=True):
        torch.testing.assert_close(value, torch.from_numpy(reference), rtol=1e-5, atol=1e-5, msg=name)
    assert torch.equal(got[1][:, :, :past_length], past[0][:, :, :past_length])  # the past kept
    assert torch.equal(got[1][:, :, past_length + steps :], past[0][:, :, past_length + steps :])  # and after it


INT4_IDS = torch.randint(1, 90, (1, 6), generator=torch.Generator().manual_seed(2))


@pytest.fixture(scope="module")
def int4_step() -> GenerativeModule:
    config = transformers.LlamaConfig(
        vocab_size=96,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    module = pipeline.convert(
        model,
        INT4_IDS,
        generation={"max_length": 32, "max_batch": 2},
        precision="int4",
        quantize_fallback="fp32",  # the rest in float32 (the default float16 rest runs without the rewrite on a CPU)
        validation_inputs=1,
    )
    assert isinstance(module, GenerativeModule)
    return module


def test_an_int4_step_converts_and_its_decoding_is_judged_by_the_quantization_envelope(
    int4_step: GenerativeModule,
) -> None:
    """``precision="int4"`` with ``generation=``: the decoding validation judges the logits by the quantization's own
    per-output tolerance (it raised ``KeyError: 'int4'`` looking for a float16-like type), and the session runs the
    4-bit weights with GroupQueryAttention when the rest of the graph is float32."""
    module = int4_step
    decoding = module.report.accuracy.decoding
    assert decoding is not None and decoding.passed
    assert any(t.data_type == onnx.TensorProto.INT4 for t in module.onnx.graph.initializer)
    assert ops(runnable_model(module.onnx, "onnxruntime", module.settings))["GroupQueryAttention"] == 2
    assert module.generate(INT4_IDS, max_new_tokens=4).shape == (1, 10)
    assert module._executor.row_session() is None  # 4-bit weights: far slower unpacked, one session for all steps


def test_an_int4_steps_kernel_reads_the_packed_projection_with_the_same_logits(int4_step: GenerativeModule) -> None:
    """With 4-bit weights the kernel reads the merged q/k/v projection packed (GenAI's form: query [batch, steps,
    (4 + 2 * 2) * 32], key and value empty, rotated by the kernel): no q/k/v Split and no RotaryEmbedding left. The
    same logits, bit for bit, as the session graph before (``fused=False``: Split and RotaryEmbedding before the
    kernel) for a left-padded batch of two through the prompt and greedy decoding."""
    graph = runnable_model(int4_step.onnx, "onnxruntime", int4_step.settings).graph
    producers = {o: n for n in graph.node for o in n.output}
    gqas = [n for n in graph.node if n.op_type == "GroupQueryAttention"]
    assert len(gqas) == 2
    for gqa in gqas:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in gqa.attribute}
        assert producers[gqa.input[0]].op_type == "MatMul" and list(gqa.input[1:3]) == ["", ""]
        assert attrs["do_rotary"] == 1 and gqa.input[9] == "position_ids"
    assert not [n for n in graph.node if n.op_type == "RotaryEmbedding"]
    assert all(len(n.output) == 2 for n in graph.node if n.op_type == "Split")  # gate/up only
    fused, apart = grouped_attention_graph(int4_step.onnx), grouped_attention_graph(int4_step.onnx, fused=False)
    assert ops(apart)["RotaryEmbedding"] == 4 and ops(apart)["Split"] == ops(fused)["Split"] + 2
    ids, mask = tiny_models.left_padded([7, 4], seed=9)
    batch, prompt = ids.shape
    full = torch.zeros(batch, 32, dtype=torch.int64)
    full[:, :prompt] = mask
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
    runners = [bound_runner(int4_step, graph) for graph in (fused, apart)]
    for runner in runners:
        runner.start(batch)
    logits = [runner.run(ids, full, positions, 0) for runner in runners]
    nxt = positions[:, -1:] + 1
    for i in range(12):
        assert torch.equal(logits[0], logits[1]), f"step {i}"
        token = logits[1].argmax(-1)[:, None]
        full[:, prompt + i] = 1
        logits = [runner.run(token, full, nxt, prompt + i) for runner in runners]
        nxt = nxt + 1
    assert torch.equal(logits[0], logits[1])


def test_a_head_size_the_kernel_refuses_keeps_the_standard_attention() -> None:
    """ONNX Runtime's GroupQueryAttention runs only head sizes that are multiples of 8; a model with heads of 12
    keeps TensorScatter + Attention in its session graph and decodes as transformers does."""
    llama = tiny_models.tiny_llama(seed=5, hidden_size=48, eos_token_id=2, pad_token_id=None)
    step = tiny_models.tiny_step(llama, max_length=24, max_batch=2)
    session_graph = runnable_model(step.onnx, "onnxruntime", step.settings)
    assert ops(session_graph)["GroupQueryAttention"] == 0 and ops(session_graph)["Attention"] == 2
    ids, mask = tiny_models.left_padded([6, 4], seed=2)
    expected = llama.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=False, eos_token_id=None)
    assert torch.equal(step.generate(ids, attention_mask=mask, max_new_tokens=10, eos_token_id=[]), expected)


def test_heads_the_kernel_cannot_rotate_keep_the_models_rotation_before_it() -> None:
    """ONNX Runtime's GroupQueryAttention rotates heads whose size is a multiple of 16 only: heads of 24 run in the
    kernel with the model's RotaryEmbedding nodes before it (on the q/k/v Split's parts), and decode a left-padded
    batch as transformers does."""
    llama = tiny_models.tiny_llama(seed=6, hidden_size=96, eos_token_id=2, pad_token_id=None)
    step = tiny_models.tiny_step(llama, max_length=24, max_batch=2)
    session_graph = runnable_model(step.onnx, "onnxruntime", step.settings)
    counts = ops(session_graph)
    assert counts["GroupQueryAttention"] == 2 and counts["RotaryEmbedding"] == 4 and counts["Attention"] == 0
    assert all(
        "do_rotary" not in {a.name for a in n.attribute} and n.input[1]
        for n in session_graph.graph.node
        if n.op_type == "GroupQueryAttention"
    )
    ids, mask = tiny_models.left_padded([6, 4], seed=2)
    expected = llama.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=False, eos_token_id=None)
    assert torch.equal(step.generate(ids, attention_mask=mask, max_new_tokens=10, eos_token_id=[]), expected)
