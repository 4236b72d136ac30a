"""Antialiased resize as two MatMuls: the weight matrices are PyTorch's own (read back from its kernel on a basis of
unit images), torchvision's antialiased ``Resize`` in front of a crop converts, matches PyTorch and builds with the
real TensorRT-RTX builder in fp32 and fp16, and a dynamic height keeps the exporter's Resize (ONNX Runtime runs it)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from rtx_build import assert_builds

import pipeline
from converters.aten.antialias import antialias_weights


def pytorch_weights(
    in_size: int, out_size: int, mode: str, align_corners: bool, scale_factor: float | None
) -> np.ndarray:
    """``[out, in]``: PyTorch's antialiased resize (float64) of each unit image ``e_k`` (height ``in_size``, width 2
    kept: identity weights; PyTorch's kernel takes another path for width 1)."""
    op = getattr(torch.ops.aten, f"_upsample_{mode}2d_aa").default
    basis = torch.eye(in_size, dtype=torch.float64).reshape(in_size, 1, in_size, 1).expand(-1, -1, -1, 2)
    resized = op(basis.contiguous(), [out_size, 2], align_corners, scale_factor, None)
    return resized[:, 0, :, 0].T.numpy()


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
@pytest.mark.parametrize(
    ("in_size", "out_size", "align_corners", "scale_factor"),
    [(16, 5, False, None), (20, 7, False, None), (17, 5, False, 0.3), (64, 16, False, None), (9, 4, True, None),
     (7, 7, False, None), (5, 12, False, None), (6, 1, True, None)],
)  # fmt: skip
def test_weights_are_pytorchs(
    mode: str, in_size: int, out_size: int, align_corners: bool, scale_factor: float | None
) -> None:
    ours = antialias_weights(in_size, out_size, mode, align_corners=align_corners, scale_factor=scale_factor)
    theirs = pytorch_weights(in_size, out_size, mode, align_corners, scale_factor)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-12)
    np.testing.assert_allclose(ours.sum(axis=1), 1.0, atol=1e-12)


class Interpolate(torch.nn.Module):
    def __init__(self, **options: object) -> None:
        super().__init__()
        self.options = options

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.interpolate(x, antialias=True, **self.options)  # type: ignore[arg-type]


def test_torchvision_resize_and_crop_convert_match_and_build_in_fp16() -> None:
    """torchvision's preprocessing (antialiased bicubic resize of the short side to 40, center crop) as a model; fp32
    is the next test's (the rewrite does not depend on the precision)."""
    import tests_environment  # noqa: F401 -- torchvision's operator schemas
    from torchvision.transforms import InterpolationMode, v2

    bicubic = InterpolationMode.BICUBIC
    model = torch.nn.Sequential(v2.Resize(40, interpolation=bicubic, antialias=True), v2.CenterCrop(32)).eval()
    x = torch.rand(1, 3, 96, 128, generator=torch.Generator().manual_seed(0))
    module = pipeline.convert(model, x, precision="fp16")  # validates against PyTorch (half's own error as the bar)
    ops = [n.op_type for n in module.onnx.graph.node]
    assert "Resize" not in ops and ops.count("MatMul") == 2
    torch.testing.assert_close(module(x).float(), model(x), atol=4e-3, rtol=0)
    assert_builds(module)


def test_dynamic_height_keeps_the_exporters_resize_on_onnx_runtime() -> None:
    model = Interpolate(size=(5, 7), mode="bilinear").eval()
    module = pipeline.convert(model, torch.randn(1, 2, 16, 20), dynamic={"x": {2: ("height", 8, 16, 32)}})
    (resize,) = [n for n in module.onnx.graph.node if n.op_type == "Resize"]
    assert {a.name: a.i for a in resize.attribute if a.name == "antialias"} == {"antialias": 1}
    x = torch.randn(1, 2, 24, 20)
    torch.testing.assert_close(module(x), model(x))
    report = pipeline.check(module.onnx, parser="static")
    assert [p.node for p in report.problems] == [resize.name]
