"""Guard constants the half type rounds to zero: ``F.normalize``'s ``eps=1e-12`` is 0 in float16 (its smallest value
is 6e-8), so a zero vector (a padded token's key, as in torchvision's Swin V2 cosine attention at a size below its
window) would normalise to ``0 / 0``. The guard and the division it protects stay float32; the rest runs in float16,
matches PyTorch and builds with TensorRT-RTX without the accuracy search."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from rtx_build import assert_builds
from torch import nn

import pipeline
from pipeline.accuracy.anchor import PrecisionMode


class CosineAttention(nn.Module):
    """Swin V2's attention scores: normalised queries and keys; the key projection has no bias (as Swin V2 zeroes
    it), so a zero token has a zero key."""

    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(16, 16)
        self.k = nn.Linear(16, 16, bias=False)
        self.v = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = F.normalize(self.q(x), dim=-1) @ F.normalize(self.k(x), dim=-1).transpose(-2, -1)
        return torch.softmax(scores * 10, dim=-1) @ self.v(x)


def test_a_zero_key_normalises_to_zero_in_fp16_and_the_guard_stays_float32() -> None:
    torch.manual_seed(0)
    model = CosineAttention().eval()
    x = torch.randn(2, 8, 16)
    x[:, 6:] = 0  # padded tokens
    module = pipeline.convert(model, x, precision="fp16", precision_search=False)
    report = module.report.precision
    assert report is not None and report.share == 1.0  # every MatMul in float16
    guarded = {i.op for i in report.islands if "rounds to 0" in i.reason}
    assert guarded == {"Clip", "Div"}, [(i.node, i.op, i.reason) for i in report.islands]
    got = module(x).float().numpy()
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, model(x).detach().numpy(), atol=1e-2, rtol=1e-2)
    assert_builds(module)


def test_pytorchs_own_float16_keeps_the_guard_as_the_graph_does() -> None:
    """The accuracy anchor (PyTorch's own float16 run) computes the guard as the graph does: without it, PyTorch's
    float16 of this model is NaN wherever a zero key is normalised, and gives no error to judge against."""
    torch.manual_seed(0)
    model = CosineAttention().eval()
    x = torch.randn(2, 8, 16)
    x[:, 6:] = 0
    with torch.no_grad():
        want = model(x)
        with PrecisionMode(torch.float16):
            own = model(x)
        naive = model.half()(x.half())
    assert own.dtype == torch.float16 and torch.isfinite(own).all()
    assert torch.isnan(naive).any()  # what plain float16 PyTorch computes
    torch.testing.assert_close(own.float(), want, atol=1e-2, rtol=1e-2)


def test_a_small_swin_v2_with_a_padded_window_converts_in_fp16_without_the_search() -> None:
    import tests_environment  # noqa: F401 -- torchvision's operator schemas
    from torchvision.models.swin_transformer import PatchMergingV2, SwinTransformer, SwinTransformerBlockV2

    torch.manual_seed(0)
    model = SwinTransformer(
        [4, 4],
        16,
        [1, 1, 1],
        [1, 2, 2],
        [8, 8],
        block=SwinTransformerBlockV2,
        downsample_layer=PatchMergingV2,
        num_classes=10,
    ).eval()
    x = torch.randn(1, 3, 64, 64)  # the last stage's 4x4 map is padded to the 8x8 window
    module = pipeline.convert(model, x, precision="fp16", precision_search=False)
    report = module.report.precision
    assert report is not None and report.share == 1.0
    assert_builds(module)
