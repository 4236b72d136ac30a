"""NVFP4 activations (``precision="nvfp4", nvfp4_activations=True``, W4A4): the ``trt::TRT_FP4DynamicQuantize``
chain ModelOpt writes (passes/quantize/dynamic_fp4.py), its exact ONNX Runtime emulation
(pipeline/runtime/ort/dynamic_emulation.py) against a numpy reference of the format on values that reach every FP4 code,
the ties and the saturation, the real TensorRT-RTX builder for compute capability 12.0 (and its refusal for 8.9),
and a small language model (its head tied to an NVFP4 embedding table) converted, validated and built."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from charlm_support import CharLM
from onnx import TensorProto, helper
from quantize_support import build_with_tensorrt_rtx

import pipeline
from converters.errors import InputError
from converters.settings import Settings
from passes import to_graph, to_model
from passes.quantize.dynamic_fp4 import DYNAMIC_QUANTIZE, activation_scale, quantize_activations
from pipeline.runtime.ort.emulation import emulate_fp4

WIDTH = 32


def reference(x: np.ndarray, scale2: float) -> np.ndarray:
    """NVFP4 dynamic quantization then dequantization in numpy, the casts by ml_dtypes: per block of 16 along the
    last axis, the FP8 E4M3 scale of ``(amax / 6) / scale2`` (saturating at 448), the E2M1 value of ``x / (fp8 x
    scale2)`` (nearest, ties to even, saturating at 6), times the same scale."""
    blocks = x.astype(np.float32).reshape(-1, 16)
    wanted = (np.abs(blocks).max(axis=1, keepdims=True) / np.float32(6)) / np.float32(scale2)
    fp8 = np.minimum(wanted, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)  # ml_dtypes: NaN past 464
    scale = (fp8 * np.float32(scale2)).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(scale > 0, blocks / scale, np.float32(0))
    return (ratio.astype(ml_dtypes.float4_e2m1fn).astype(np.float32) * scale).reshape(x.shape)


def quantizing_graph(float_type: int, scale2: float) -> onnx.ModelProto:
    """x [B, 4, WIDTH] -> (the NVFP4 activation chain) -> Identity -> y."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"], name="read")],
        "g",
        [helper.make_tensor_value_info("x", float_type, ["B", 4, WIDTH])],
        [helper.make_tensor_value_info("y", float_type, ["B", 4, WIDTH])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 11
    gs_graph, metadata = to_graph(model)
    assert quantize_activations(gs_graph, [("read", 0)], {"read": scale2}) == 1
    return to_model(gs_graph, model, metadata)


def every_code() -> np.ndarray:
    """Rows of 16 (scale2 = 1, each block's largest magnitude 6: FP8 scale 1, so x / scale = x): every E2M1 value
    and sign, every tie between neighbours, values between them, and a block of 6000 whose FP8 scale saturates at
    448 and whose values then saturate at 6; a zero block; and random blocks."""
    grid = [6, -6, 4, -4, 3, -3, 2, -2, 1.5, -1.5, 1, -1, 0.5, -0.5, 0, 0.25]
    ties = [6, 0.75, 1.25, 1.75, 2.5, 3.5, 5, -0.75, -1.25, -1.75, -2.5, -3.5, -5, -0.25, 5.9, 0.26]
    between = [-6, 0.6, 0.9, 1.1, 1.4, 1.6, 1.9, 2.2, 2.9, 3.1, 3.9, 4.1, 4.9, 5.1, 0.1, -2.6]
    saturating = [6000, -6000, 3000, 2500, 2700, 1000, 500, 100, -50, 7, 0, 0.5, -2000, 4000, 5500, 2688]
    rows = np.array([grid, ties, between, saturating, [0.0] * 16, [6, *([1e-30] * 15)]], np.float32)
    rng = np.random.default_rng(0)
    random = (rng.standard_normal((10, 16)) * rng.uniform(0.01, 5, (10, 1))).astype(np.float32)
    return np.concatenate([rows, random]).reshape(2, 4, WIDTH)


@pytest.mark.parametrize("float_type", [TensorProto.FLOAT, TensorProto.FLOAT16])
def test_emulation_matches_the_numpy_reference_on_every_code_and_saturation(float_type: int) -> None:
    x = every_code().astype(helper.tensor_dtype_to_np_dtype(float_type))
    model = quantizing_graph(float_type, 1.0)
    onnx.checker.check_model(model, full_check=True)
    kinds = [(n.domain, n.op_type) for n in model.graph.node]
    assert kinds[:3] == [("trt", DYNAMIC_QUANTIZE), ("", "DequantizeLinear"), ("", "DequantizeLinear")]
    quantizer = model.graph.node[0]
    attributes = {a.name: helper.get_attribute_value(a) for a in quantizer.attribute}
    assert attributes == {"axis": -1, "block_size": 16, "scale_type": TensorProto.FLOAT8E4M3FN}
    with pytest.raises(Exception, match=DYNAMIC_QUANTIZE):
        ort.InferenceSession(model.SerializeToString())  # why the emulation exists
    emulated = emulate_fp4(model)
    got = ort.InferenceSession(emulated.SerializeToString()).run(None, {"x": x})[0].astype(np.float32)
    want = reference(x.astype(np.float32), 1.0)
    np.testing.assert_array_equal(got, want.astype(x.dtype).astype(np.float32))
    codes = want.reshape(-1, 16)[:3].ravel()
    assert set(np.unique(codes)) == {0.0, *(s * v for v in (0.5, 1, 1.5, 2, 3, 4, 6) for s in (1, -1))}
    np.testing.assert_array_equal(want.reshape(-1, 16)[1, 1:7], [1, 1, 2, 2, 4, 4])  # ties to even
    saturated = want.reshape(-1, 16)[3]  # FP8 scale 448: 6000 / 448 saturates at 6
    assert saturated[0] == 6 * 448 and saturated[1] == -6 * 448 and saturated[9] == 0


def test_emulation_matches_the_reference_with_a_calibrated_scale() -> None:
    x = (np.random.default_rng(1).standard_normal((3, 4, WIDTH)) * 3).astype(np.float32)
    errors = []
    for fraction in (1.0, 0.05):  # the calibrated range, and one 20x too small: FP8 scales saturate at 448
        scale2 = activation_scale(float(np.abs(x).max()) * fraction)
        model = emulate_fp4(quantizing_graph(TensorProto.FLOAT, scale2))
        got = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
        np.testing.assert_array_equal(got, reference(x, scale2))
        errors.append(np.linalg.norm(got - x) / np.linalg.norm(x))
    assert 0.02 < errors[0] < 0.15 < errors[1]  # 4 bits: a few percent; saturated: clipped values


def w4a4_lm() -> torch.nn.Module:
    torch.manual_seed(0)
    model = CharLM(40, width=64, layers=1).eval()
    model.head.weight = model.embed.weight  # tied: with quantize_embeddings the head reads the 4-bit table
    return model


SAMPLE = torch.randint(0, 40, (2, 16), generator=torch.Generator().manual_seed(0))


def test_a_language_model_in_w4a4_validates_on_onnx_runtime_and_builds_for_12_0_only() -> None:
    module = pipeline.convert(w4a4_lm(), SAMPLE, precision="nvfp4", nvfp4_activations=True, quantize_embeddings=True)
    report = module.report.quantization
    assert report is not None and module.report.accuracy is not None and module.report.accuracy.passed
    quantizers = [n for n in module.onnx.graph.node if n.op_type == DYNAMIC_QUANTIZE]
    assert len(quantizers) == 5  # one per 4-bit MatMul: qkv, proj, fc1, fc2 and the tied head read five tensors
    assert [op.op for op in report.quantized].count("Gather") == 1  # the NVFP4 table the head reads too
    assert any("W4A4" in note and "emulation" in note for note in report.notes)
    assert build_with_tensorrt_rtx(module.onnx, capabilities=("12.0",)) > 0
    with pytest.raises(AssertionError, match="builder failed"):
        build_with_tensorrt_rtx(module.onnx, capabilities=("8.9",))


def test_nvfp4_activations_are_off_by_default_and_need_nvfp4() -> None:
    assert not Settings(precision="nvfp4").nvfp4_activations  # the default: W4A16
    with pytest.raises(InputError, match="nvfp4_activations=True .* precision is 'int4'"):
        Settings(precision="int4", nvfp4_activations=True)
