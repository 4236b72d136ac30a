"""Property-based tests of the passes: random ONNX graphs through every default pass and the precision rewrite.

For every graph ``random_graphs.random_graph`` draws (elementwise and broadcasting, MatMul/Gemm/Conv, Reshape/
Transpose/Squeeze chains, reductions, Concat/Split/Slice, constants and identities, dead branches, several outputs):
the passes' result passes ``onnx.checker`` (full), runs on ONNX Runtime, and gives exactly the outputs of the input
graph (fp32 passes); the fp16 and bf16 rewrites give a valid graph whose CPU emulation runs and stays near the fp32
outputs; and the real TensorRT-RTX builder builds the fp32, fp16 and bf16 results whenever it built the input.
``benchmarks/fuzz_passes.py`` runs the same properties on thousands of graphs.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from hypothesis import HealthCheck, given, settings
from random_graphs import feeds, random_graph
from rtx_build import rtx_build_error

from converters.settings import Settings
from passes import PassManager, default_passes, to_graph, to_model
from pipeline.runtime.ort.half_emulation import emulate_low_precision

EXAMPLES = 200
PROFILE = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


def run_passes(model: onnx.ModelProto, precision: str = "fp32") -> onnx.ModelProto:
    """The default pass list (no converters) on ``model``, as ``pipeline.convert`` runs it."""
    graph, metadata = to_graph(model)
    manager = PassManager(default_passes(), max_iterations=4)
    graph, _ = manager.run(graph, Settings(precision=precision))  # type: ignore[arg-type]
    return to_model(graph, model, metadata)


def run_ort(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Outputs of ``model`` on ONNX Runtime's CPU provider, graph optimizations off (what the graph says, exactly)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return list(session.run(None, feed))


def check_fp32(model: onnx.ModelProto) -> None:
    """The property for the fp32 passes; raises AssertionError with what differs."""
    onnx.checker.check_model(model, full_check=True)
    feed = feeds(model)
    before = run_ort(model, feed)
    after_model = run_passes(model)
    onnx.checker.check_model(after_model, full_check=True)
    after = run_ort(after_model, feed)
    assert [o.name for o in after_model.graph.output] == [o.name for o in model.graph.output]
    for name, want, got in zip((o.name for o in model.graph.output), before, after, strict=True):
        assert got.shape == want.shape and got.dtype == want.dtype, name
        np.testing.assert_array_equal(got, want, err_msg=f"output {name} changed by the passes")


def check_low(model: onnx.ModelProto, precision: str) -> None:
    """The property for the precision rewrite: valid, runs (emulated on the CPU), finite, near the fp32 outputs."""
    feed = feeds(model)
    reference = run_ort(model, feed)
    low = run_passes(model, precision)
    onnx.checker.check_model(low, full_check=True)
    emulated = run_ort(emulate_low_precision(low), feed)
    eps = 2.0**-10 if precision == "fp16" else 2.0**-7
    for name, want, got in zip((o.name for o in model.graph.output), reference, emulated, strict=True):
        assert got.shape == want.shape, name
        assert np.isfinite(got).all(), f"output {name} is not finite in {precision}"
        # a loose bound: a few roundings of every operand's magnitude (the graphs are at most a dozen ops deep)
        scale = float(np.abs(want).max(initial=0.0)) + 1.0
        np.testing.assert_allclose(got, want, atol=64 * eps * scale, rtol=16 * eps, err_msg=name)


@PROFILE
@given(random_graph())
def test_default_passes_keep_outputs_exactly(model: onnx.ModelProto) -> None:
    check_fp32(model)


@settings(PROFILE, max_examples=100)
@given(random_graph(max_ops=8))
def test_fp16_rewrite_is_valid_and_near_fp32(model: onnx.ModelProto) -> None:
    check_low(model, "fp16")


@settings(PROFILE, max_examples=50)
@given(random_graph(max_ops=8))
def test_bf16_rewrite_is_valid_and_near_fp32(model: onnx.ModelProto) -> None:
    check_low(model, "bf16")


@settings(PROFILE, max_examples=100)
@given(random_graph(max_ops=8))
def test_real_builder_builds_what_the_passes_give_when_it_built_the_input(model: onnx.ModelProto) -> None:
    before = rtx_build_error(model)
    if before is not None:
        return  # the input itself is out of the builder's reach: nothing to hold the passes to
    for precision in ("fp32", "fp16", "bf16"):
        error = rtx_build_error(run_passes(model, precision))
        assert error is None, f"{precision}: the real builder built the input but not the passes' result: {error}"


def test_the_generator_covers_what_the_properties_claim() -> None:
    """A property that never sees an op proves nothing about it: 300 drawn graphs hold every op family."""
    seen: set[str] = set()

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(random_graph())
    def collect(model: onnx.ModelProto) -> None:
        seen.update(n.op_type for n in model.graph.node)

    collect()
    wanted = {
        "Add",
        "Mul",
        "Div",
        "MatMul",
        "Gemm",
        "Conv",
        "Reshape",
        "Transpose",
        "Unsqueeze",
        "Squeeze",
        "ReduceSum",
        "Concat",
        "Split",
        "Slice",
        "Constant",
        "Identity",
        "Exp",
    }
    assert wanted <= seen, f"never drawn: {sorted(wanted - seen)}"
