"""When TensorRT-RTX builds the float32 graph but not the float16 one, the precision stage keeps the nodes whose float16
form breaks the build in float32 (:mod:`pipeline.precision.build_fallback`) and names them in the report.

The real case (issue 38): transformers' MobileViTV2 in float16 fails inside Myelin with ``formats.cpp:3118:
CHECK(def_tactic_desc) failed``, a message that names no node; the search finds ``layer.4.conv_1x1`` (a 1x1 Conv on the
last, 2x2 map) by bisection. The config is the smallest that still fails (64x64 is the smallest image the model takes;
width, blocks and expansions at their least), so the conversion with its search takes about 15 s here.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import onnx
import pytest
import torch
from rtx_build import SKIP_REASON, assert_builds
from torch import nn

import pipeline
from pipeline.precision import buildable
from pipeline.precision.buildable import rtx_available
from pipeline.runtime.executors import EngineNotRunnableWarning

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.skipif(not rtx_available(), reason=SKIP_REASON)

NOTE = "kept in float32 because TensorRT-RTX does not build them in float16: "


def mobilevitv2() -> tuple[nn.Module, torch.Tensor]:
    config = transformers.MobileViTV2Config(
        image_size=64, width_multiplier=0.125, n_attn_blocks=[1, 1, 1], expand_ratio=1.0, ffn_multiplier=1, num_labels=4
    )
    model = transformers.MobileViTV2ForImageClassification(config)
    # transformers' initialisation (std 0.02) shrinks the activations ~50x a layer: the logits come out exactly 0, and
    # matching them would prove nothing. PyTorch's own initialisation keeps them of order 1.
    for module in model.modules():
        if module is not model and hasattr(module, "reset_parameters"):
            module.reset_parameters()
    return model.eval(), torch.randn(1, 3, 64, 64)


def input_type(model: onnx.ModelProto, node: str) -> int:
    inferred = onnx.shape_inference.infer_shapes(model).graph
    types = {v.name: v.type.tensor_type.elem_type for v in [*inferred.value_info, *inferred.input]}
    return types[next(n for n in model.graph.node if n.name == node).input[0]]


def test_mobilevitv2_fp16_keeps_the_conv_tensorrt_rtx_rejects_in_float32() -> None:
    model, sample = mobilevitv2()
    with warnings.catch_warnings():  # the engine builds here but cannot run without a GPU: ONNX Runtime runs the graph
        warnings.simplefilter("ignore", EngineNotRunnableWarning)
        module = pipeline.convert(model, sample, backend="tensorrt-rtx", precision="fp16")
    precision = module.report.precision
    assert precision is not None
    kept = [i for i in precision.islands if i.source == "build"]
    assert [(i.op, i.module) for i in kept] == [("Conv", "mobilevitv2.encoder.layer.4.conv_1x1.convolution")]
    assert "CHECK(def_tactic_desc) failed" in kept[0].reason
    (note,) = [n for n in precision.notes if n.startswith(NOTE)]
    assert note.startswith(NOTE + kept[0].node + " (") and "CHECK(def_tactic_desc) failed" in note
    assert f"node:{kept[0].node}" in precision.keep_fp32()  # reusable: keep_fp32=report.keep_fp32() skips the search
    assert input_type(module.onnx, kept[0].node) == onnx.TensorProto.FLOAT
    assert precision.share > 0.95  # one small Conv, not the graph, went back to float32
    assert_builds(module)
    # validation passed, and fresh inputs match PyTorch fp32 within the float16 tolerance
    assert module.report.accuracy is not None and module.report.accuracy.passed
    tolerance = pipeline.DEFAULT_TOLERANCES["float16"]
    fresh = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(11))
    with torch.no_grad():
        want = model(fresh).logits
    error = (module(fresh).logits - want).abs()
    assert bool((error <= torch.clamp(tolerance.rtol * want.abs(), min=tolerance.atol)).all()), error


def counting(function: Callable[..., str | None], calls: list[None]) -> Callable[..., str | None]:
    def counted(*args: object, **kwargs: object) -> str | None:
        calls.append(None)
        return function(*args, **kwargs)

    return counted


def test_a_graph_that_builds_in_float16_costs_one_build_and_no_search(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[None] = []
    monkeypatch.setattr(buildable, "build_error", counting(buildable.build_error, calls))
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3), nn.Flatten(), nn.Linear(8 * 4 * 4, 4))
    module = pipeline.convert(model.eval(), torch.randn(2, 3, 8, 8), backend="onnxruntime", precision="fp16")
    precision = module.report.precision
    assert precision is not None
    assert len(calls) == 1  # the float16 graph, once; neither the float32 graph nor a candidate
    assert not [i for i in precision.islands if i.source == "build"]
    assert not [n for n in precision.notes if n.startswith(NOTE)]
