"""A float32 attention island over a float16 KV cache: the graph that crashed TensorRT-RTX 1.7.1's builder.

Found on transformers' IDEFICS in fp16 (``benchmarks/vision_language_families.py --only idefics --precision fp16``):
the accuracy search kept one self-attention of the text step in float32 while the static cache is float16, so the
step held ``TensorScatter (float16 cache write) -> Cast (float32) -> Attention (float32)``, and the builder died of a
segmentation fault on it (the attention marked decomposable, as the TensorRT backends mark every attention). Those
nodes alone crash it. The precision pass now writes such an attention out as MatMul/Softmax/MatMul in its own type
(:mod:`passes.precision.cache_attention`); here the smallest step is converted to float16 with its attention kept in
float32, built by the real builder in a child process (a crash is this test's failure, not a dead worker), and the
written-out form checked against ONNX ``Attention`` on ONNX Runtime (grouped heads, a boolean and a float mask).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper
from rtx_build import SKIP_REASON

from converters.settings import Settings
from passes.base import PassResult
from passes.precision.cache_attention import write_out_cast_cache_attention
from passes.precision.convert import ConvertPrecision
from pipeline.precision.buildable import rtx_available

BATCH, STEPS, CAPACITY, DIM = 2, 3, 64, 16

#: Parses with TensorRT-RTX, marks every attention decomposable (the backend's parse_network) and builds ahead of time.
CHILD = textwrap.dedent(
    """
    import sys
    import onnx
    from pipeline.backends.tensorrt.build import parse_network
    from pipeline.runtime.tensorrt.library import TENSORRT_RTX

    builder, network, parser = parse_network(onnx.load(sys.argv[1]), library=TENSORRT_RTX)
    plan = builder.build_serialized_network(network, builder.create_builder_config())
    sys.exit(0 if plan is not None else 3)
    """
)


def cached_step(q_heads: int = 2, kv_heads: int = 2, mask: str = "bool", mask_heads: int = 1) -> onnx.ModelProto:
    """A float32 cached attention step: both caches written by TensorScatter at ``pos``, attention over them."""
    f = T.FLOAT
    kv = [BATCH, kv_heads, CAPACITY, DIM]
    inputs = [helper.make_tensor_value_info("q", f, [BATCH, q_heads, STEPS, DIM])]
    nodes = []
    outputs = [helper.make_tensor_value_info("o", f, [BATCH, q_heads, STEPS, DIM])]
    for name in ("key", "value"):
        inputs += [
            helper.make_tensor_value_info(f"past_{name}", f, kv),
            helper.make_tensor_value_info(f"new_{name}", f, [BATCH, kv_heads, STEPS, DIM]),
        ]
        nodes.append(helper.make_node("TensorScatter", [f"past_{name}", f"new_{name}", "pos"], [name], axis=-2))
        outputs.append(helper.make_tensor_value_info(name, f, kv))
    inputs.append(helper.make_tensor_value_info("pos", T.INT64, [BATCH]))
    mask_type = T.BOOL if mask == "bool" else f
    inputs.append(helper.make_tensor_value_info("mask", mask_type, [BATCH, mask_heads, STEPS, CAPACITY]))
    nodes.append(helper.make_node("Attention", ["q", "key", "value", "mask"], ["o"], name="attention", scale=0.25))
    graph = helper.make_graph(nodes, "cached_step", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 24)])
    model.ir_version = 10
    return model


@pytest.fixture
def unfixed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The precision pass as it was before the rewrite: the attention island stays an Attention node."""

    class Off:
        def __call__(self, graph: gs.Graph, settings: Settings) -> PassResult:
            return PassResult(graph, False)

    monkeypatch.setattr("passes.precision.convert.write_out_cast_cache_attention", Off)


def half_with_float32_attention(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` in float16 (float16 inputs and outputs, as a generation step's) with its attention kept in float32."""
    graph = gs.import_onnx(model)
    ConvertPrecision()(graph, Settings(precision="fp16", precision_io="low", keep_fp32=("op:Attention",)))
    out = gs.export_onnx(graph)
    out.ir_version = 10
    onnx.checker.check_model(out, full_check=True)
    return out


def rtx_build_exit(model: onnx.ModelProto, directory: Path) -> int:
    """The exit code of a child process building ``model`` with TensorRT-RTX: 0 built, 3 refused, < 0 a signal."""
    path = directory / "model.onnx"
    onnx.save(model, path)
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run([sys.executable, "-c", CHILD, str(path)], cwd=root, capture_output=True, timeout=300)
    return done.returncode


@pytest.mark.usefixtures("unfixed")
def test_emitted_pattern_is_the_crashing_one() -> None:
    """Without the rewrite the float16 step holds TensorScatter -> Cast(float32) -> Attention: the builder's crash."""
    model = half_with_float32_attention(cached_step())
    ops = [n.op_type for n in model.graph.node]
    assert "Attention" in ops
    producers = {o: n for n in model.graph.node for o in n.output}
    attention = next(n for n in model.graph.node if n.op_type == "Attention")
    cast = producers[attention.input[1]]
    assert cast.op_type == "Cast" and producers[cast.input[0]].op_type == "TensorScatter"


def test_float32_attention_over_half_cache_is_written_out() -> None:
    model = half_with_float32_attention(cached_step())
    ops = [n.op_type for n in model.graph.node]
    assert "Attention" not in ops and "Softmax" in ops
    softmax = next(n for n in model.graph.node if n.op_type == "Softmax")
    types = {v.name: v.type.tensor_type.elem_type for v in onnx.shape_inference.infer_shapes(model).graph.value_info}
    assert types[softmax.output[0]] == T.FLOAT  # still the island's float32
    assert [o.type.tensor_type.elem_type for o in model.graph.output] == [T.FLOAT16] * 3


@pytest.mark.skipif(not rtx_available(), reason=SKIP_REASON)
def test_tensorrt_rtx_builds_float32_attention_over_half_cache(tmp_path: Path) -> None:
    code = rtx_build_exit(half_with_float32_attention(cached_step()), tmp_path)
    assert code == 0, f"TensorRT-RTX did not build the step (exit {code}; a negative code is the signal it died of)"


@pytest.mark.usefixtures("unfixed")
@pytest.mark.parametrize(
    ("q_heads", "kv_heads", "mask", "mask_heads"),
    [(2, 2, "bool", 1), (4, 2, "bool", 1), (4, 2, "bool", 4), (4, 2, "float", 1), (4, 2, "float", 4)],
)
def test_written_out_attention_matches_onnx_attention(q_heads: int, kv_heads: int, mask: str, mask_heads: int) -> None:
    """The rewrite alone, on a float32 step whose caches are read through casts from float16: ONNX Runtime gives what
    the Attention node gives."""
    model = half_with_float32_attention(cached_step(q_heads, kv_heads, mask, mask_heads))
    graph = gs.import_onnx(model)
    assert write_out_cast_cache_attention()(graph, Settings()).modified
    written = gs.export_onnx(graph)
    written.ir_version = 10
    onnx.checker.check_model(written, full_check=True)
    rng = np.random.default_rng(0)
    half = np.float16
    seen = rng.random((BATCH, mask_heads, STEPS, CAPACITY)) > 0.3
    feed: dict[str, np.ndarray] = {
        "q": rng.standard_normal((BATCH, q_heads, STEPS, DIM)).astype(half),
        "pos": np.array([5, 5], np.int64),
        "mask": seen if mask == "bool" else np.where(seen, rng.standard_normal(seen.shape), -1e4).astype(half),
    }
    for name in ("key", "value"):
        feed[f"past_{name}"] = rng.standard_normal((BATCH, kv_heads, CAPACITY, DIM)).astype(half)
        feed[f"new_{name}"] = rng.standard_normal((BATCH, kv_heads, STEPS, DIM)).astype(half)
    expected, actual = (
        ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(["o"], feed)[0]
        for m in (model, written)
    )
    np.testing.assert_allclose(actual.astype(np.float32), expected.astype(np.float32), atol=1e-3, rtol=1e-3)
