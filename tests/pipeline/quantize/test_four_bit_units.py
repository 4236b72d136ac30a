"""The 4-bit step of the quantize stage (``pipeline.quantize.four_bit``) on hand-written graphs, without a model or
an export: the targets chosen from the precision, output heads found through element-wise ops, the report's notes
in full, the weights and scales written into the graph (max scales and AWQ's, against :mod:`pipeline.quantize.awq`
and :mod:`passes.quantize.blockwise` run by hand on the same activations), NVFP4 activations and embedding tables.
ONNX Runtime runs the small graphs; each test takes well under a second, so that mutation testing (docs/mutation.md)
can run them per mutant. The stage end to end, on models: test_quantize_4bit.py and test_quantize_verdicts.py.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from converters.errors import ConversionError, InputError
from passes import to_graph
from passes.quantize.blockwise import BLOCK_FORMATS, BlockFormat, fake_quantize, quantize
from pipeline.exporting.stage import ExportedGraph
from pipeline.quantize.awq import awq, sample_tokens
from pipeline.quantize.format_step import StageInputs
from pipeline.quantize.four_bit import quantize_four_bit, target_settings
from pipeline.runtime.io_spec import IOSpec, TensorSpec
from pipeline.settings import Settings

INT4, NVFP4 = BLOCK_FORMATS["int4"], BLOCK_FORMATS["nvfp4"]
K = 32  # input channels of every layer


def layers_graph(opset: int = 21, head_path: tuple[str, ...] = ("Add",)) -> onnx.ModelProto:
    """x [4, 32] -> q = x Wq, k = x Wk (two layers reading x) -> h = relu(q) + k -> y = h Wo (+ b, through
    ``head_path``) -> out; and ``side`` = relu(x Ws): a layer whose output reaches a graph output through a Relu (not
    a head). Input channel 3 of x is 30x the others (an outlier channel)."""
    rng = np.random.default_rng(0)
    init = [numpy_helper.from_array(rng.standard_normal((K, K)).astype(np.float32), n) for n in ("wq", "wk", "wo")]
    init.append(numpy_helper.from_array(rng.standard_normal((K, 16)).astype(np.float32), "ws"))
    init.append(numpy_helper.from_array(np.full((K,), 0.5, np.float32), "b"))
    nodes = [
        helper.make_node("MatMul", ["x", "wq"], ["q"], name="q_proj"),
        helper.make_node("MatMul", ["x", "wk"], ["k"], name="k_proj"),
        helper.make_node("Relu", ["q"], ["q_relu"], name="relu"),
        helper.make_node("Add", ["q_relu", "k"], ["h"], name="mix"),
        helper.make_node("MatMul", ["h", "wo"], ["y0"], name="head"),
        helper.make_node("MatMul", ["x", "ws"], ["s0"], name="side_proj"),
        helper.make_node("Relu", ["s0"], ["side"], name="side_relu"),
    ]
    tensor = "y0"
    for i, op in enumerate(head_path):
        inputs = [tensor, "b"] if op == "Add" else [tensor]
        nodes.append(helper.make_node(op, inputs, [f"y{i + 1}"], name=f"path{i}"))
        tensor = f"y{i + 1}"
    nodes.append(helper.make_node("Identity", [tensor], ["out"], name="out_identity"))
    graph = helper.make_graph(
        nodes,
        "layers",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, K])],
        [
            helper.make_tensor_value_info("out", TensorProto.FLOAT, [4, K]),
            helper.make_tensor_value_info("side", TensorProto.FLOAT, [4, 16]),
        ],
        init,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def feeds(count: int = 3) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    out = []
    for _ in range(count):
        x = rng.standard_normal((4, K)).astype(np.float32)
        x[:, 3] *= 30.0
        out.append({"x": x})
    return out


def run(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # no MatMulNBits fusion: exact
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in model.graph.output]
    return dict(zip(names, session.run(names, feed), strict=True))


def stage_inputs(model: onnx.ModelProto, settings: Settings) -> StageInputs:
    io = IOSpec(
        inputs=(TensorSpec("x", "float32", (4, K)),),
        outputs=(TensorSpec("out", "float32", (4, K)), TensorSpec("side", "float32", (4, 16))),
        input_tree="",
        input_leaves=(),
        output_tree="",
        output_leaves=(),
        signature=(),
    )
    calibration = feeds()
    references = [run(model, feed) for feed in calibration]  # the float32 graph stands in for PyTorch
    exported = ExportedGraph(model, io, {})
    return StageInputs(model, to_graph(model)[0], exported, calibration, references, settings)


def settings(**changes: object) -> Settings:
    base = {"precision": "int4", "block_size": 16, "quantize_fallback": "fp32", "trt_compute_capabilities": ("8.9",)}
    return Settings(**{**base, **changes})  # type: ignore[arg-type]


def four_bit_weights(model: onnx.ModelProto) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray | None]]:
    """MatMul/Gather node -> (stored 4-bit values, block scales, the per-tensor scale or None), read through its
    DequantizeLinear chain."""
    init = {t.name: t for t in model.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output}
    found = {}
    for node in model.graph.node:
        if node.op_type not in ("MatMul", "Gather"):
            continue
        tensor = node.input[1] if node.op_type == "MatMul" else node.input[0]
        while tensor in producers and producers[tensor].op_type in ("Transpose", "Cast", "DequantizeLinear"):
            producer = producers[tensor]
            if producer.op_type == "DequantizeLinear" and producer.input[0] in init:
                values = numpy_helper.to_array(init[producer.input[0]])
                scale = producer.input[1]
                if scale in init:
                    found[node.name] = (values, numpy_helper.to_array(init[scale]), None)
                else:  # NVFP4: the FP8 block scales are themselves dequantized by the per-tensor scale
                    inner = producers[scale]
                    found[node.name] = (
                        values,
                        numpy_helper.to_array(init[inner.input[0]]),
                        numpy_helper.to_array(init[inner.input[1]]),
                    )
                break
            tensor = producer.input[0]
    return found


def as_stored(found: tuple[np.ndarray, np.ndarray, np.ndarray | None]) -> tuple[np.ndarray, np.ndarray]:
    """(codes as int64, block scales) in the ``[N, K]`` / ``[N, K / block]`` layout of :mod:`blockwise` (a MatMul
    weight is stored ``[K, N]``, its scales ``[K / block, N]``)."""
    values, scales, _ = found
    codes = values.astype(np.int64) if values.dtype.kind in "iu" or "int" in str(values.dtype) else values
    if values.ndim == 2 and scales.shape[0] * 16 <= values.shape[0] and scales.shape[1] == values.shape[1]:
        return codes.T, scales.T
    return codes, scales


def matrix(model: onnx.ModelProto, name: str) -> np.ndarray:
    """The ``[N, K]`` matrix of a MatMul weight ``[K, N]``."""
    return numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == name)).T.copy()


# -- targets -------------------------------------------------------------------------------------------------------


def test_nvfp4_targets_12_0_unless_given_and_int4_keeps_the_targets() -> None:
    assert target_settings(
        settings(precision="nvfp4", trt_compute_capabilities=()), NVFP4
    ).trt_compute_capabilities == ("12.0",)
    given = settings(precision="nvfp4", trt_compute_capabilities=("12.1",))
    assert target_settings(given, NVFP4) is given
    for targets in ((), ("8.0",), ("8.6", "9.0"), ("10",)):
        plain = settings(trt_compute_capabilities=targets)
        assert target_settings(plain, INT4) is plain


@pytest.mark.parametrize(
    ("fmt", "targets", "message"),
    [
        (
            INT4,
            ("7.5", "8.6", "7"),
            "[input] precision='int4' cannot run on compute capability 7.5, 7: TensorRT builds int4 weights for "
            "compute capability 8.0 and later\n  fix: drop 7.5, 7 from trt_compute_capabilities, or use "
            "precision='int8' / 'fp16' there",
        ),
        (
            NVFP4,
            ("11.9", "12.0"),
            "[input] precision='nvfp4' cannot run on compute capability 11.9: TensorRT builds float4e2m1 weights for "
            "compute capability 12.0 and later (12.0 and 12.1, Blackwell RTX)\n  fix: drop 11.9 from "
            "trt_compute_capabilities, or use precision='int8' / 'fp16' there",
        ),
        (
            INT4,
            ("8.x",),
            "[input] trt_compute_capabilities entry '8.x' is not 'major.minor'\n  fix: e.g. ('8.9',)",
        ),
    ],
    ids=["int4-low", "nvfp4-low", "not-a-capability"],
)
def test_targets_the_format_cannot_run_on_are_an_error_that_names_them(
    fmt: BlockFormat, targets: tuple[str, ...], message: str
) -> None:
    given = dataclasses.replace(settings(), trt_compute_capabilities=targets)
    with pytest.raises(InputError) as error:
        target_settings(given, fmt)
    assert str(error.value) == message


# -- the step on a graph -------------------------------------------------------------------------------------------


def test_max_scales_quantize_every_layer_but_the_head_as_blockwise_computes_them() -> None:
    model = layers_graph()
    result = quantize_four_bit(stage_inputs(model, settings()), model, INT4, "max")
    stored = four_bit_weights(result.model)
    assert set(stored) == {"q_proj", "k_proj", "side_proj"}
    for node, weight in (("q_proj", "wq"), ("k_proj", "wk"), ("side_proj", "ws")):
        expected = quantize(INT4, matrix(model, weight), 16)
        assert stored[node][0].dtype == expected.values.dtype and stored[node][2] is None
        codes, block_scales = as_stored(stored[node])
        assert np.array_equal(codes, expected.values.astype(np.int64))
        assert np.array_equal(block_scales, expected.scales)
    report = result.report
    assert [op.node for op in report.quantized] == ["q_proj", "k_proj", "side_proj"]
    assert [(s.node, s.op, s.reason) for s in report.skipped] == [
        ("head", "MatMul", "keep_head: computes graph output 'out' (keep_head=False quantizes it)")
    ]
    assert (report.precision, report.method, report.opset) == ("int4", "max", 21)
    assert report.notes == (
        "INT4 weights, symmetric, one scale per 16 input channels (zero points 0); activations in fp32 (weight-only)",
        "ONNX Runtime fuses them into MatMulNBits at accuracy level 1 (ort_int4_accuracy_level; 1: float32, exact)",
        "TensorRT builds int4 for compute capability 8.0 and later",
        "validation: rtol 0, atol = 2 x the largest error of the graph on ONNX Runtime on the calibration and "
        "validation inputs (report.quantization.tolerances), unless tolerances= names the output or 'float32'",
    )
    # the error measured: the quantized graph against the references, relative L2 over the outputs
    assert 0 < report.relative_error < 0.2
    assert (result.record, result.backend, result.measured) == ("quantize_int4", "auto", settings())
    assert result.nodes_before == len(result.model.graph.node)
    assert result.tolerances({"out": 0.25, "side": 1e-9}) == {"out": (0.5, 0.0), "side": (1e-6, 0.0)}


@pytest.mark.parametrize(
    "path", [("Add",), ("Cast", "Reshape"), ("Transpose", "Transpose"), ("Unsqueeze", "Squeeze"), ()]
)
def test_a_head_is_found_through_element_wise_ops_and_keep_head_false_quantizes_it(path: tuple[str, ...]) -> None:
    model = layers_graph(head_path=path)
    _fix_path_attributes(model)
    kept = quantize_four_bit(stage_inputs(model, settings()), model, INT4, "max").report
    assert "head" not in {op.node for op in kept.quantized} and [s.node for s in kept.skipped] == ["head"]
    quantized = quantize_four_bit(stage_inputs(model, settings(keep_head=False)), model, INT4, "max").report
    assert {op.node for op in quantized.quantized} == {"q_proj", "k_proj", "side_proj", "head"}
    assert quantized.skipped == ()


def _fix_path_attributes(model: onnx.ModelProto) -> None:
    """Give the head path's shape ops what they need to be identities on [4, 32]."""
    for node in model.graph.node:
        if node.op_type == "Cast":
            node.attribute.append(helper.make_attribute("to", TensorProto.FLOAT))
        elif node.op_type == "Reshape":
            model.graph.initializer.append(numpy_helper.from_array(np.array([4, K], np.int64), f"{node.name}_shape"))
            node.input.append(f"{node.name}_shape")
        elif node.op_type == "Transpose":
            node.attribute.append(helper.make_attribute("perm", [1, 0]))
        elif node.op_type in ("Squeeze", "Unsqueeze"):
            model.graph.initializer.append(numpy_helper.from_array(np.array([0], np.int64), f"{node.name}_axes"))
            node.input.append(f"{node.name}_axes")


def test_a_layer_computing_a_graph_output_is_a_head_and_one_whose_output_branches_is_not() -> None:
    model = layers_graph()
    model.graph.output.append(helper.make_tensor_value_info("y0", TensorProto.FLOAT, [4, K]))  # the layer's own
    report = quantize_four_bit(stage_inputs(model, settings()), model, INT4, "max").report
    assert [(s.node, s.reason) for s in report.skipped] == [
        ("head", "keep_head: computes graph output 'y0' (keep_head=False quantizes it)")
    ]
    model = layers_graph()
    model.graph.node.append(helper.make_node("Relu", ["y0"], ["y0_relu"], name="other_reader"))
    model.graph.output.append(helper.make_tensor_value_info("y0_relu", TensorProto.FLOAT, [4, K]))
    report = quantize_four_bit(stage_inputs(model, settings()), model, INT4, "max").report
    assert "head" in {op.node for op in report.quantized}  # its output branches: not a head


def test_awq_writes_the_searchs_weights_and_scales_and_says_what_it_gained() -> None:
    model = layers_graph()
    inputs = stage_inputs(model, settings(calibration_method="awq"))
    result = quantize_four_bit(inputs, model, INT4, "awq")
    x = np.concatenate([f["x"] for f in inputs.feeds])
    rng_h = [run(_with_output(model, "h"), f)["h"] for f in inputs.feeds]
    activations = {"x": x, "h": np.concatenate(rng_h)}
    matrices = {n: matrix(model, w) for n, w in (("q_proj", "wq"), ("k_proj", "wk"), ("side_proj", "ws"))}
    scales, clipped, choices = awq(INT4, {"x": ["q_proj", "k_proj", "side_proj"]}, activations, matrices, 16)
    stored = four_bit_weights(result.model)
    for node in matrices:
        expected = quantize(INT4, clipped[node] * scales[node][None, :], 16)
        codes, got_scales = as_stored(stored[node])
        assert np.array_equal(codes, expected.values.astype(np.int64))
        assert np.allclose(got_scales, expected.scales, rtol=1e-6)
    (choice,) = choices
    gain = choice.error_max / choice.error_awq
    assert result.report.notes[-1] == (
        f"awq (Lin et al., MLSys 2024): 1 activation tensors, alphas {choice.alpha:.2f}; summed layer output error "
        f"{gain:.2f}x lower than max scales on up to 12 calibration tokens per tensor"
    )
    assert result.report.method == "awq"
    # the graph reads x through one Mul by 1 / s before the three layers
    muls = [n for n in result.model.graph.node if n.op_type == "Mul" and "x" in n.input]
    assert len(muls) == 1
    inverse = numpy_helper.to_array(next(t for t in result.model.graph.initializer if t.name in muls[0].input))
    assert np.allclose(inverse.ravel(), 1.0 / scales["q_proj"], rtol=1e-6)
    # and computes what the search fitted: each layer's output from the scaled, clipped, quantized weight
    out = run(_with_output(result.model, "s0"), inputs.feeds[0])["s0"]
    approx = fake_quantize(INT4, clipped["side_proj"] * scales["side_proj"][None, :], 16)
    expected_s0 = (inputs.feeds[0]["x"] / scales["side_proj"][None, :]) @ approx.T
    assert np.allclose(out, expected_s0, rtol=1e-4, atol=1e-4)


def _with_output(model: onnx.ModelProto, name: str) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    copy.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    return copy


def test_awq_searches_with_float16_block_scales_when_the_fallback_is_float16() -> None:
    """The search rounds its candidates' block scales to the graph's float type (here the graph handed in is float32,
    so the stored scales are float32: the weights show which search ran)."""
    model = layers_graph()
    fp16 = settings(calibration_method="awq", quantize_fallback="fp16")
    result = quantize_four_bit(stage_inputs(model, fp16), model, INT4, "awq")
    x = np.concatenate([f["x"] for f in feeds()])
    matrices = {n: matrix(model, w) for n, w in (("q_proj", "wq"), ("k_proj", "wk"), ("side_proj", "ws"))}
    scales, clipped, _ = awq(INT4, {"x": list(matrices)}, {"x": x}, matrices, 16, np.float16)
    codes, _ = as_stored(four_bit_weights(result.model)["side_proj"])
    expected = quantize(INT4, clipped["side_proj"] * scales["side_proj"][None, :], 16)
    assert np.array_equal(codes, expected.values.astype(np.int64))
    scales32, clipped32, _ = awq(INT4, {"x": list(matrices)}, {"x": x}, matrices, 16)
    other = quantize(INT4, clipped32["side_proj"] * scales32["side_proj"][None, :], 16)
    assert not np.array_equal(codes, other.values.astype(np.int64))  # the float32 search gives other weights


def test_nvfp4_raises_the_opset_to_23_and_says_so_in_its_notes() -> None:
    model = layers_graph()
    nvfp4 = settings(precision="nvfp4", trt_compute_capabilities=("12.0",))
    result = quantize_four_bit(stage_inputs(model, nvfp4), model, NVFP4, "max")
    assert [(o.domain, o.version) for o in result.model.opset_import if o.domain in ("", "ai.onnx")] == [("", 23)]
    assert result.report.opset == 23 and result.record == "quantize_nvfp4"
    assert result.report.notes[:3] == (
        "NVFP4 weights: FP4 E2M1 values, FP8 E4M3 scales per block of 16, one float32 scale per tensor; activations "
        "in fp32 (weight-only)",
        "ONNX Runtime has no FP4 kernel: it runs the exact emulation (the weights dequantized ahead of time)",
        "TensorRT builds float4e2m1 for compute capability 12.0 and later (12.x)",
    )
    values, scales, scale2 = four_bit_weights(result.model)["side_proj"]
    expected = quantize(NVFP4, matrix(model, "ws"), 16)
    assert float(np.asarray(scale2).ravel()[0]) == expected.scale2
    onnx.checker.check_model(result.model, full_check=True)
    spelled = layers_graph()  # the default domain may also be spelled "ai.onnx": raised the same
    spelled.opset_import[0].domain = "ai.onnx"
    raised = quantize_four_bit(stage_inputs(spelled, nvfp4), spelled, NVFP4, "max").model
    assert [(o.domain, o.version) for o in raised.opset_import if o.domain in ("", "ai.onnx")] == [("ai.onnx", 23)]
    at_20 = layers_graph(opset=20)  # below the quantize stage's opset: not raised, and refused
    with pytest.raises(ConversionError, match=r"nvfp4 DequantizeLinear needs ONNX opset >= 23, the graph has 20"):
        quantize_four_bit(stage_inputs(at_20, nvfp4), at_20, NVFP4, "max")


def tied_model(table: np.ndarray, heads: np.ndarray) -> onnx.ModelProto:
    """ids -> Gather(table) -> q_proj -> lm_head and lm_head2, whose weights are both ``heads`` (``table.T``: tied)."""
    rng = np.random.default_rng(2)
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["table", "ids"], ["emb"], name="embed"),
            helper.make_node("MatMul", ["emb", "wq"], ["h"], name="q_proj"),
            helper.make_node("MatMul", ["h", "table_t"], ["out"], name="lm_head"),
            helper.make_node("MatMul", ["h", "table_t2"], ["out2"], name="lm_head2"),
        ],
        "tied",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [4])],
        [
            helper.make_tensor_value_info("out", TensorProto.FLOAT, [4, 10]),
            helper.make_tensor_value_info("out2", TensorProto.FLOAT, [4, 10]),
        ],
        [
            numpy_helper.from_array(table, "table"),
            numpy_helper.from_array(rng.standard_normal((K, K)).astype(np.float32), "wq"),
            numpy_helper.from_array(heads.copy(), "table_t"),
            numpy_helper.from_array(heads.copy(), "table_t2"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def test_an_untied_embedding_table_is_noted_without_heads() -> None:
    table = np.random.default_rng(2).standard_normal((10, K)).astype(np.float32)
    model = tied_model(table, 2 * table.T)  # heads of their own
    io = IOSpec(
        (TensorSpec("ids", "int64", (4,)),),
        (TensorSpec("out", "float32", (4, 10)), TensorSpec("out2", "float32", (4, 10))),
        "",
        (),
        "",
        (),
        (),
    )
    calibration = [{"ids": np.array([0, 3, 5, 9], np.int64)}]
    embed = settings(quantize_embeddings=True, keep_head=False)
    inputs = StageInputs(
        model, to_graph(model)[0], ExportedGraph(model, io, {}), calibration, [run(model, calibration[0])], embed
    )
    notes = quantize_four_bit(inputs, model, INT4, "max").report.notes
    assert notes[-1] == (
        f"quantize_embeddings: 1 embedding tables in 4 bits ({10 * K} values), DequantizeLinear before the Gather"
    )


def test_a_tied_embedding_table_is_stored_once_and_noted() -> None:
    table = np.random.default_rng(2).standard_normal((10, K)).astype(np.float32)
    model = tied_model(table, table.T)  # the table transposed, folded: both heads tied
    io = IOSpec(
        (TensorSpec("ids", "int64", (4,)),),
        (TensorSpec("out", "float32", (4, 10)), TensorSpec("out2", "float32", (4, 10))),
        "",
        (),
        "",
        (),
        (),
    )
    calibration = [{"ids": np.array([0, 3, 5, 9], np.int64)}]
    references = [run(model, calibration[0])]
    embed = settings(quantize_embeddings=True, keep_head=False)
    inputs = StageInputs(model, to_graph(model)[0], ExportedGraph(model, io, {}), calibration, references, embed)
    result = quantize_four_bit(inputs, model, INT4, "max")
    assert result.report.notes[-1] == (
        f"quantize_embeddings: 1 embedding tables in 4 bits ({10 * K} values), DequantizeLinear before the Gather; "
        "tied heads reading the same 4-bit table: lm_head (tied to embed), lm_head2 (tied to embed)"
    )
    codes, scales = as_stored(four_bit_weights(result.model)["embed"])
    expected = quantize(INT4, table, 16)
    assert np.array_equal(codes, expected.values.astype(np.int64)) and np.array_equal(scales, expected.scales)
    assert [(op.node, op.op) for op in result.report.quantized] == [
        ("q_proj", "MatMul"),
        ("embed", "Gather"),
        ("lm_head", "MatMul"),
        ("lm_head2", "MatMul"),
    ]
    assert not [
        t for t in result.model.graph.initializer if t.name in ("table_t", "table_t2")
    ]  # stored once: the 4-bit table
    untied = StageInputs(model, to_graph(model)[0], ExportedGraph(model, io, {}), calibration, references, settings())
    assert "quantize_embeddings" not in " ".join(quantize_four_bit(untied, model, INT4, "max").report.notes)


def w4a4_graph() -> onnx.ModelProto:
    """Two layers reading x [4, 32] (one activation tensor) and one reading x4 [1, 2, 4, 32] (4-D: TensorRT's dynamic
    quantization takes 2-D and 3-D activations only); every output a graph output."""
    rng = np.random.default_rng(3)
    init = [
        numpy_helper.from_array(rng.standard_normal((K, 16)).astype(np.float32), n) for n in ("wa", "wb", "wc", "wd")
    ]
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "wa"], ["ya"], name="a_proj"),
            helper.make_node("MatMul", ["x", "wb"], ["yb"], name="b_proj"),
            helper.make_node("MatMul", ["x4", "wc"], ["yc"], name="c_proj"),
            helper.make_node("MatMul", ["x4", "wd"], ["yd"], name="d_proj"),
        ],
        "w4a4",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, K]),
            helper.make_tensor_value_info("x4", TensorProto.FLOAT, [1, 2, 4, K]),
        ],
        [
            helper.make_tensor_value_info("ya", TensorProto.FLOAT, [4, 16]),
            helper.make_tensor_value_info("yb", TensorProto.FLOAT, [4, 16]),
            helper.make_tensor_value_info("yc", TensorProto.FLOAT, [1, 2, 4, 16]),
            helper.make_tensor_value_info("yd", TensorProto.FLOAT, [1, 2, 4, 16]),
        ],
        init,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


@pytest.mark.parametrize(("method", "magnitude"), [("max", 1.0), ("awq", 1.0), ("max", 1e-3)])
def test_nvfp4_activations_are_noted_and_scaled_by_their_calibrated_amax(method: str, magnitude: float) -> None:
    """The per-tensor scale of an activation is its largest magnitude over the calibration inputs / (6 * 448), after
    AWQ's ``1 / s`` (what the layers read), also when that magnitude is under 1."""
    model = w4a4_graph()
    rng = np.random.default_rng(4)
    calibration = []
    for _ in range(3):
        x = rng.standard_normal((4, K)).astype(np.float32) * np.float32(magnitude)
        x[:, 3] *= 30.0
        calibration.append({"x": x, "x4": rng.standard_normal((1, 2, 4, K)).astype(np.float32)})
    assert (max(np.abs(f["x"]).max() for f in calibration) < 1) == (magnitude < 1)
    references = [run(model, feed) for feed in calibration]
    io = IOSpec(
        (TensorSpec("x", "float32", (4, K)), TensorSpec("x4", "float32", (1, 2, 4, K))),
        tuple(TensorSpec(n, "float32", ()) for n in ("ya", "yb", "yc", "yd")),
        "",
        (),
        "",
        (),
        (),
    )
    w4a4 = settings(precision="nvfp4", trt_compute_capabilities=("12.0",), nvfp4_activations=True, keep_head=False)
    inputs = StageInputs(model, to_graph(model)[0], ExportedGraph(model, io, {}), calibration, references, w4a4)
    result = quantize_four_bit(inputs, model, NVFP4, method)
    assert [n for n in result.report.notes if n.startswith("W4A4")] == [
        "W4A4: 1 activation tensors of 2 MatMuls quantized to NVFP4 at run time (trt::TRT_FP4DynamicQuantize, "
        "blocks of 16, FP8 scales, a per-tensor scale of the calibrated amax / (6 * 448)); ONNX Runtime runs its "
        "exact emulation (float32 ops), TensorRT the real op (compute capability 12.x); float activations kept at "
        "c_proj (nvfp4_activations: TensorRT quantizes 2-D and 3-D activations, 'x4' has shape [1, 2, 4, 32]), d_proj "
        "(nvfp4_activations: TensorRT quantizes 2-D and 3-D activations, 'x4' has shape [1, 2, 4, 32])"
    ]
    init = {t.name: numpy_helper.to_array(t) for t in result.model.graph.initializer}
    (scale2,) = [v for name, v in init.items() if name.endswith("/input_nvfp4/scale2")]
    xs = np.concatenate([f["x"] for f in calibration])
    if method == "awq":  # the amax of the activation the layers read: x / s
        inverse = init["x/awq_inverse_scale"]
        xs = xs * inverse.reshape(1, -1)
    assert float(scale2) == np.float32(np.abs(xs).max() / (6 * 448))


def test_keep_fp32_leaves_a_layer_out() -> None:
    model = layers_graph()
    report = quantize_four_bit(stage_inputs(model, settings(keep_fp32=("node:side_proj",))), model, INT4, "max").report
    assert [op.node for op in report.quantized] == ["q_proj", "k_proj"]
    assert "side_proj" in {s.node for s in report.skipped} and "side_proj" not in four_bit_weights(
        quantize_four_bit(stage_inputs(model, settings(keep_fp32=("node:side_proj",))), model, INT4, "max").model
    )


def test_awq_on_a_transposed_gemm_and_two_activations_with_small_errors() -> None:
    """A Gemm with ``transB=1`` keeps its weight ``[N, K]`` (no transpose back), each activation tensor gets its own
    alpha in the note, and the gain is the ratio of the summed errors even when they are far under 1."""
    rng = np.random.default_rng(5)
    w1 = (rng.standard_normal((K, K)) * 0.01).astype(np.float32)  # [N, K]: read with transB=1
    w2 = (rng.standard_normal((K, 16)) * 0.01).astype(np.float32)  # [K, N]
    graph = helper.make_graph(
        [
            helper.make_node("Gemm", ["x", "w1"], ["h"], name="g1", transB=1),
            helper.make_node("Relu", ["h"], ["h2"], name="relu1"),
            helper.make_node("MatMul", ["h2", "w2"], ["o"], name="m2"),
            helper.make_node("Relu", ["o"], ["out"], name="relu2"),
        ],
        "gemm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, K])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [4, 16])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    calibration = feeds()
    io = IOSpec((TensorSpec("x", "float32", (4, K)),), (TensorSpec("out", "float32", (4, 16)),), "", (), "", (), ())
    references = [run(model, f) for f in calibration]
    awq_settings = settings(calibration_method="awq")
    inputs = StageInputs(model, to_graph(model)[0], ExportedGraph(model, io, {}), calibration, references, awq_settings)
    result = quantize_four_bit(inputs, model, INT4, "awq")
    x = np.concatenate([f["x"] for f in calibration])
    h2 = np.concatenate([run(_with_output(model, "h2"), f)["h2"] for f in calibration])
    scales, clipped, choices = awq(INT4, {"x": ["g1"], "h2": ["m2"]}, {"x": x, "h2": h2}, {"g1": w1, "m2": w2.T}, 16)
    stored = four_bit_weights_any(result.model)
    for node in ("g1", "m2"):
        codes, _ = as_stored(stored[node])
        expected = quantize(INT4, clipped[node] * scales[node][None, :], 16)
        assert np.array_equal(codes, expected.values.astype(np.int64)), node
    error_max, error_awq = sum(c.error_max for c in choices), sum(c.error_awq for c in choices)
    assert error_awq < 1.0  # under the floor of the division (1e-30), far under 1
    assert result.report.notes[-1] == (
        f"awq (Lin et al., MLSys 2024): 2 activation tensors, alphas {choices[0].alpha:.2f}, {choices[1].alpha:.2f}; "
        f"summed layer output error {error_max / error_awq:.2f}x lower than max scales on up to 12 calibration "
        "tokens per tensor"
    )


def four_bit_weights_any(model: onnx.ModelProto) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray | None]]:
    """:func:`four_bit_weights` for Gemm nodes too."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for node in copy.graph.node:
        if node.op_type == "Gemm":
            node.op_type = "MatMul"  # only read, never run: the weight is its input 1 as a MatMul's
    return four_bit_weights(copy)


@pytest.mark.parametrize("seed", [0, 3])
def test_awq_past_1024_tokens_fits_on_the_sample_the_seed_draws(seed: int) -> None:
    """1200 calibration tokens, a tenth of them with a large channel: which 1024 the seed draws moves that channel's
    mean, and so ``s`` (the graph's ``1 / s``), run after run the same for one seed."""
    rng = np.random.default_rng(6)
    weight = rng.standard_normal((K, 16)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["o"], name="proj"),
            helper.make_node("Relu", ["o"], ["out"], name="relu"),
        ],
        "tokens",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", K])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["n", 16])],
        [numpy_helper.from_array(weight, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    calibration = []
    for _ in range(2):
        x = rng.standard_normal((600, K)).astype(np.float32)
        x[rng.random(600) < 0.1, 3] *= 100.0
        calibration.append({"x": x})
    io = IOSpec((TensorSpec("x", "float32", ("n", K)),), (TensorSpec("out", "float32", ("n", 16)),), "", (), "", (), ())
    references = [run(model, f) for f in calibration]
    seeded = settings(calibration_method="awq", seed=seed)
    inputs = StageInputs(model, to_graph(model)[0], ExportedGraph(model, io, {}), calibration, references, seeded)
    result = quantize_four_bit(inputs, model, INT4, "awq")
    inverse = numpy_helper.to_array(next(t for t in result.model.graph.initializer if t.name == "x/awq_inverse_scale"))
    sample = sample_tokens([f["x"] for f in calibration], seed)
    scales, _, _ = awq(INT4, {"x": ["proj"]}, {"x": sample}, {"proj": weight.T.copy()}, 16)
    assert np.allclose(inverse.ravel(), 1.0 / scales["proj"], rtol=1e-6)
    other, _, _ = awq(
        INT4,
        {"x": ["proj"]},
        {"x": sample_tokens([f["x"] for f in calibration], seed + 1)},
        {"proj": weight.T.copy()},
        16,
    )
    assert not np.allclose(other["proj"], scales["proj"], rtol=1e-6)  # another draw: other scales


def test_nvfp4_activations_all_taken_say_nothing_of_kept_ones() -> None:
    model = layers_graph()
    w4a4 = settings(precision="nvfp4", trt_compute_capabilities=("12.0",), nvfp4_activations=True)
    result = quantize_four_bit(stage_inputs(model, w4a4), model, NVFP4, "max")
    assert result.report.notes[-1] == (
        "W4A4: 1 activation tensors of 3 MatMuls quantized to NVFP4 at run time (trt::TRT_FP4DynamicQuantize, "
        "blocks of 16, FP8 scales, a per-tensor scale of the calibrated amax / (6 * 448)); ONNX Runtime runs its "
        "exact emulation (float32 ops), TensorRT the real op (compute capability 12.x)"
    )
