"""``precision_io="low"``: with ``precision="fp16"`` the graph's float inputs and outputs are float16 themselves (no
casts at the boundary) and the converted module takes and returns float16 tensors; PyTorch fp32 stays the reference.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
import torch
from torch import nn

import pipeline

BACKEND = "onnxruntime"
FLOAT16 = onnx.TensorProto.FLOAT16


class SmallCNN(nn.Module):
    """Conv and Linear in float16; the final LayerNorm is a float32 island, so one output is cast to float16."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Linear(8 * 4 * 4, 6)
        self.norm = nn.LayerNorm(6)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.head(self.features(x).flatten(1))
        return logits, self.norm(logits)


def fresh(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def model() -> nn.Module:
    torch.manual_seed(0)
    return SmallCNN().eval()


@pytest.fixture(scope="module")
def low_io(model: nn.Module) -> pipeline.ConvertedModule:
    return pipeline.convert(model, fresh(2, 3, 8, 8, seed=1), backend=BACKEND, precision="fp16", precision_io="low")


def boundary_types(graph: onnx.GraphProto) -> list[int]:
    return [v.type.tensor_type.elem_type for v in [*graph.input, *graph.output]]


def assert_within_fp16(got: torch.Tensor, want: torch.Tensor) -> None:
    tolerance = pipeline.DEFAULT_TOLERANCES["float16"]
    error = (got.float() - want).abs()
    allowed = torch.clamp(tolerance.rtol * want.abs(), min=tolerance.atol)
    assert bool((error <= allowed).all()), f"worst error / tolerance: {float((error / allowed).max()):.3g}"


def test_graph_inputs_and_outputs_are_float16(low_io: pipeline.ConvertedModule) -> None:
    graph = low_io.onnx.graph
    assert boundary_types(graph) == [FLOAT16] * 3
    assert [t.dtype for t in (*low_io.io.inputs, *low_io.io.outputs)] == ["float16"] * 3
    first = next(n for n in graph.node if graph.input[0].name in n.input)
    assert first.op_type == "Conv"  # no cast at the input boundary
    producers = {out: n for n in graph.node for out in n.output}
    assert producers[graph.output[0].name].op_type == "Gemm"  # a low output: no cast
    assert producers[graph.output[1].name].op_type == "Cast"  # the LayerNorm island's output, cast to float16
    onnx.checker.check_model(low_io.onnx, full_check=True)


def test_module_takes_and_returns_float16(low_io: pipeline.ConvertedModule, model: nn.Module) -> None:
    x = fresh(5, 3, 8, 8, seed=11).half()
    with pytest.raises(pipeline.InputError, match="batch|size|axis"):
        low_io(x)  # the sample's fixed batch of 2
    x = x[:2]
    logits, normed = low_io(x)
    assert logits.dtype == normed.dtype == torch.float16
    want_logits, want_normed = model(x.float())  # PyTorch fp32 on the same (float16) values
    assert_within_fp16(logits, want_logits)
    assert_within_fp16(normed, want_normed)
    accuracy = low_io.report.accuracy
    assert accuracy is not None and accuracy.passed
    assert [o.dtype for o in accuracy.outputs] == ["float16", "float16"]
    assert accuracy.outputs[0].rtol == pipeline.DEFAULT_TOLERANCES["float16"].rtol
    assert any("precision_io='low'" in line for line in low_io.report.precision.summary_lines())


def test_float32_input_is_an_input_error_naming_the_dtype(low_io: pipeline.ConvertedModule) -> None:
    with pytest.raises(pipeline.InputError, match="float32.*float16"):
        low_io(fresh(2, 3, 8, 8, seed=3))


def test_artifact_round_trips_float16_io(low_io: pipeline.ConvertedModule, tmp_path: Path) -> None:
    loaded = pipeline.load(low_io.save(tmp_path / "cnn_fp16_io.ptrt"))
    assert loaded.io == low_io.io
    assert loaded.settings.precision_io == "low"
    assert boundary_types(loaded.onnx.graph) == [FLOAT16] * 3
    x = fresh(2, 3, 8, 8, seed=4).half()
    for got, want in zip(loaded(x), low_io(x), strict=True):
        assert got.dtype == torch.float16
        torch.testing.assert_close(got, want, atol=0, rtol=0)
    with pytest.raises(pipeline.InputError, match="float32"):
        loaded(x.float())


def test_default_keeps_the_model_types(model: nn.Module) -> None:
    module = pipeline.convert(model, fresh(2, 3, 8, 8, seed=1), backend=BACKEND, precision="fp16")
    assert module.settings.precision_io == "model"
    assert boundary_types(module.onnx.graph) == [onnx.TensorProto.FLOAT] * 3
    assert [t.dtype for t in module.io.inputs] == ["float32"]
    logits, _ = module(fresh(2, 3, 8, 8, seed=5))
    assert logits.dtype == torch.float32


def test_mlp_search_feeds_the_backend_float16() -> None:
    """A tight tolerance makes the search run: calibration runs the float16-input graph and PyTorch fp32."""
    torch.manual_seed(2)
    mlp = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 4)).eval()
    module = pipeline.convert(
        mlp,
        fresh(8, 16, seed=6),
        backend=BACKEND,
        precision="fp16",
        precision_io="low",
        tolerances={"float16": (1e-4, 1e-3)},
        validate=False,
    )
    report = module.report.precision
    assert report is not None and report.search is not None
    assert boundary_types(module.onnx.graph) == [FLOAT16] * 2
    assert module(fresh(8, 16, seed=7).half()).dtype == torch.float16


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"precision": "bf16", "precision_io": "low"}, "numpy has no bfloat16"),
        ({"precision": "fp32", "precision_io": "low"}, "needs a low precision"),
        ({"precision": "fp16", "precision_io": "half"}, "unknown precision_io"),
    ],
)
def test_precision_io_is_validated(settings: dict[str, str], match: str) -> None:
    with pytest.raises(pipeline.InputError, match=match):
        pipeline.Settings(**settings)  # type: ignore[arg-type]
