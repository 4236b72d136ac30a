"""Mixture-of-experts dispatch (``transformers::grouped_mm_fallback``) lowered to ops TensorRT builds: transformers'
Mixtral and Qwen2-MoE (random weights, 4 experts, top-2 routing) convert, match PyTorch and build with the real
TensorRT-RTX builder; the lowering gives each routed row its own expert's product, rows past the last offset zero."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
from model_sources import transformers_models
from rtx_build import assert_builds

import pipeline


@pytest.mark.parametrize(("architecture", "precision"), [("mixtral", "fp32"), ("qwen2_moe", "fp16")])
def test_moe_models_convert_and_build(architecture: str, precision: str) -> None:
    model, sample = transformers_models.build(architecture)
    module = pipeline.convert(model, sample, precision=precision)
    ops = {n.op_type for n in module.onnx.graph.node}
    assert "grouped_mm_fallback" not in ops and "MatMul" in ops
    assert_builds(module)


class Grouped(torch.nn.Module):
    """The custom op alone: rows sorted by expert, ``offs`` the cumulative counts (experts 1 and 3 get none)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(4, 6, 5, generator=torch.Generator().manual_seed(1)))

    def forward(self, x: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
        return torch.ops.transformers.grouped_mm_fallback(x, self.weight, offs)


def test_rows_take_their_own_expert() -> None:
    import transformers.integrations.moe  # noqa: F401 -- registers transformers::grouped_mm_fallback

    model = Grouped().eval()
    x = torch.randn(7, 6, generator=torch.Generator().manual_seed(2))
    offs = torch.tensor([3, 3, 6, 6], dtype=torch.int32)  # the 7th row is past the last offset: zero
    module = pipeline.convert(model, (x, offs), validate=False)
    session = ort.InferenceSession(module.onnx.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    for counts in ([3, 3, 6, 6], [0, 2, 2, 7], [7, 7, 7, 7]):
        offsets = torch.tensor(counts, dtype=torch.int32)
        want = model(x, offsets).detach().numpy()
        (got,) = session.run(None, dict(zip(names, [x.numpy(), offsets.numpy()], strict=True)))
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert_builds(module)
