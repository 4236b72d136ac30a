"""An AveragePool window over TensorRT's limit that covers the whole input, as a GlobalAveragePool: the real
TensorRT-RTX parser rejects the original and builds the rewrite, ONNX Runtime gives the same numbers (ceil_mode,
padding counted or not, 1-D to 3-D, float16), other windows are left with the reason, and transformers'
EfficientNet (its ``AvgPool2d(hidden_dim, ceil_mode=True)`` pooler) converts, matches PyTorch and builds."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
import torch
from rtx_build import assert_builds, rtx_build_error
from test_parser_fixes_support import apply, assert_same_outputs, assert_unchanged, ops, parse

import pipeline
from passes.parser_fixes.average_pool import OversizedAveragePoolToGlobal
from passes.rules import Facts

HEADER = '<ir_version: 10, opset_import: ["" : 18]>\n'

POOLS = [
    # (case, input shape, attributes, ops after)
    ("EfficientNet's pooler", [1, 4, 2, 3], "kernel_shape=[2560, 2560], strides=[2560, 2560], ceil_mode=1, "
     "count_include_pad=1", ["GlobalAveragePool"]),
    ("padding counted", [1, 2, 3, 5], "kernel_shape=[400, 400], strides=[400, 400], pads=[1, 2, 1, 2], ceil_mode=1, "
     "count_include_pad=1", ["GlobalAveragePool", "Mul"]),
    ("padding not counted", [1, 2, 3, 5], "kernel_shape=[400, 400], strides=[400, 400], pads=[1, 1, 1, 1], "
     "ceil_mode=1", ["GlobalAveragePool"]),
    ("begin padding only, floor", [2, 1, 4, 100000], "kernel_shape=[5, 100000], strides=[1, 1], pads=[1, 0, 0, 0], "
     "count_include_pad=1", ["GlobalAveragePool", "Mul"]),
    ("1-D", [2, 3, 7], "kernel_shape=[100000], strides=[100000], ceil_mode=1", ["GlobalAveragePool"]),
    ("3-D", [1, 2, 2, 3, 2], "kernel_shape=[320, 320, 320], strides=[320, 320, 320], ceil_mode=1, "
     "count_include_pad=1", ["GlobalAveragePool"]),
]  # fmt: skip


def pool_model(shape: list[int], attrs: str, dtype: str = "float") -> onnx.ModelProto:
    dims = ",".join(map(str, shape))
    out = ",".join(map(str, shape[:2] + [1] * (len(shape) - 2)))
    model = parse(f"{HEADER}g ({dtype}[{dims}] x) => ({dtype}[{out}] y) {{ y = AveragePool<{attrs}>(x) }}")
    model.graph.node[0].name = "pool"
    return model


@pytest.mark.parametrize(("case", "shape", "attrs", "after_ops"), POOLS, ids=[p[0] for p in POOLS])
def test_rewrite_matches_onnx_runtime_and_builds(case: str, shape: list[int], attrs: str, after_ops: list[str]) -> None:
    model = pool_model(shape, attrs)
    assert "maxKernelDimsProduct" in str(rtx_build_error(model))
    after, result = apply(OversizedAveragePoolToGlobal(), model)
    assert result.modified and ops(after) == after_ops
    assert all(n.name.startswith("pool") for n in after.graph.node)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    assert_same_outputs(model, after, {"x": x}, rtol=1e-6, atol=1e-7)
    assert rtx_build_error(after) is None


def test_float16() -> None:
    model = pool_model([1, 3, 4, 4], "kernel_shape=[400, 400], strides=[400, 400], pads=[1, 1, 1, 1], ceil_mode=1, "
                       "count_include_pad=1", dtype="float16")  # fmt: skip
    after, _ = apply(OversizedAveragePoolToGlobal(), model)
    x = np.random.default_rng(1).standard_normal((1, 3, 4, 4)).astype(np.float16)
    assert_same_outputs(model, after, {"x": x}, rtol=2e-3, atol=1e-3)
    assert rtx_build_error(after) is None


@pytest.mark.parametrize(
    ("case", "shape", "attrs", "reason"),
    [
        ("a window the parser takes", [1, 1, 7, 7], "kernel_shape=[7, 7]", "within TensorRT's limit"),
        ("more than one window", [1, 1, 2, 8], "kernel_shape=[2, 50000], strides=[1, 1], pads=[0, 0, 0, 49999]",
         "more than one window on spatial axis 1"),
        ("begin padding leaves the end out", [1, 1, 3, 3], "kernel_shape=[1000, 1000], strides=[1000, 1000], "
         "pads=[998, 0, 0, 0], ceil_mode=1", "does not cover the whole input on spatial axis 0"),
        ("SAME padding", [1, 1, 3, 3], 'kernel_shape=[400, 400], auto_pad="SAME_UPPER"', "auto_pad SAME_UPPER"),
        ("a 3-D window under the 3-D limit", [1, 1, 4, 4, 4], "kernel_shape=[100, 100, 100], strides=[1, 1, 1], "
         "ceil_mode=1", "within TensorRT's limit (31622777 for a 3-D window)"),
    ],
)  # fmt: skip
def test_left_unchanged_with_the_reason(case: str, shape: list[int], attrs: str, reason: str) -> None:
    dims, symbolic = ",".join(map(str, shape)), ",".join(f"d{i}" for i in range(len(shape)))
    model = parse(f"{HEADER}g (float[{dims}] x) => (float[{symbolic}] y) {{ y = AveragePool<{attrs}>(x) }}")
    assert_unchanged(OversizedAveragePoolToGlobal(), model)
    graph = gs.import_onnx(model)
    assert reason in str(OversizedAveragePoolToGlobal().check(graph.nodes[0], Facts(graph)))


def test_transformers_efficientnet_converts_matches_and_builds() -> None:
    """The pooler is ``AvgPool2d(hidden_dim, ceil_mode=True)``: 320 x 320 over an 8 x 8 map at this width (fp16: the
    rewrite builds in :func:`test_float16`)."""
    import tests_environment  # noqa: F401 -- torchvision's operator schemas, before transformers' vision models
    import transformers

    config = transformers.EfficientNetConfig(
        image_size=32, width_coefficient=0.25, depth_coefficient=0.1, kernel_sizes=[3, 3], in_channels=[32, 16],
        out_channels=[16, 24], strides=[1, 2], num_block_repeats=[1, 1], expand_ratios=[1, 6], hidden_dim=320,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.EfficientNetModel(config).eval()
    for layer in model.modules():  # activations of a useful size (the default init shrinks them to 1e-22)
        if isinstance(layer, torch.nn.Conv2d):
            torch.nn.init.kaiming_normal_(layer.weight)
        elif isinstance(layer, torch.nn.BatchNorm2d):
            torch.nn.init.ones_(layer.weight)
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    module = pipeline.convert(model, x)  # validates every output against PyTorch
    torch.testing.assert_close(module(x).pooler_output, model(x).pooler_output)
    assert "AveragePool" not in ops(module.onnx) and "GlobalAveragePool" in ops(module.onnx)
    assert_builds(module)


@pytest.mark.parametrize(
    ("kernel", "builds"),
    [([316, 316], True), ([317, 317], False), ([300, 300, 351], True), ([300, 300, 352], False)],
)
def test_window_limits_per_rank_as_the_builder_and_the_static_check_see_them(kernel: list[int], builds: bool) -> None:
    """The builder's limit is 100,000 elements for a 2-D window, about 31.6 million for a 3-D one; the static check
    says what the builder does (a window the size of the input, nothing for the fix to do)."""
    dims = ",".join(map(str, [1, 1, *kernel]))
    ones = ",".join(["1"] * (2 + len(kernel)))
    model = parse(f"{HEADER}g (float[{dims}] x) => (float[{ones}] y) {{ y = AveragePool<kernel_shape={kernel}>(x) }}")
    model.graph.node[0].name = "pool"
    error = rtx_build_error(model)
    assert (error is None) == builds, error
    check = pipeline.check(model, trt_version="11.1")
    assert check.ok == builds, check.summary()
