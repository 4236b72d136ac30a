"""NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss as their ONNX definitions: the values of ONNX Runtime's
kernels (every reduction, weights, the ignored index, spatial targets), the real TensorRT-RTX parser rejects the
original and builds the rewrite, and PyTorch's nll_loss and cross_entropy convert, match PyTorch and build."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
import torch
import torch.nn.functional as F
from rtx_build import assert_builds, rtx_build_error
from test_parser_fixes_support import apply, assert_same_outputs, ops, parse

import pipeline
from converters.settings import DynamicDim
from passes.parser_fixes.losses import ClassLossToGather
from passes.rules import Facts

HEADER = '<ir_version: 10, opset_import: ["" : 20]>\n'

LOSSES = [
    # (case, op, reduction, weighted, ignore_index, scores shape)
    ("nll mean", "NegativeLogLikelihoodLoss", "mean", False, None, [4, 5]),
    ("nll sum weighted", "NegativeLogLikelihoodLoss", "sum", True, None, [4, 5]),
    ("nll none ignore", "NegativeLogLikelihoodLoss", "none", False, 2, [4, 5]),
    ("nll mean weighted ignore", "NegativeLogLikelihoodLoss", "mean", True, 2, [4, 5]),
    ("nll spatial", "NegativeLogLikelihoodLoss", "mean", True, -100, [2, 5, 3, 2]),
    ("cross entropy mean ignore", "SoftmaxCrossEntropyLoss", "mean", False, -100, [4, 5]),
    ("cross entropy none weighted", "SoftmaxCrossEntropyLoss", "none", True, 1, [4, 5]),
    ("cross entropy spatial sum", "SoftmaxCrossEntropyLoss", "sum", False, None, [2, 5, 3]),
]


def loss_model(op: str, reduction: str, weighted: bool, ignore: int | None, shape: list[int]) -> onnx.ModelProto:
    dims = ",".join(map(str, shape))
    target = ",".join(map(str, [shape[0], *shape[2:]]))
    out = f"float[{target}] y" if reduction == "none" else "float y"
    attrs = f'reduction="{reduction}"' + ("" if ignore is None else f", ignore_index={ignore}")
    weight = f", float[{shape[1]}] w" if weighted else ""
    model = parse(
        f"{HEADER}g (float[{dims}] x, int64[{target}] t{weight}) => ({out}) "
        f"{{ y = {op}<{attrs}>(x, t{', w' if weighted else ''}) }}"
    )
    model.graph.node[0].name = "loss"
    return model


def loss_feeds(shape: list[int], weighted: bool, ignore: int | None) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32)
    target = rng.integers(0, shape[1], [shape[0], *shape[2:]])
    if ignore is not None and ignore >= 0:
        target.reshape(-1)[::3] = ignore  # several ignored targets
    elif ignore is not None:
        target.reshape(-1)[0] = ignore
    feeds = {"x": x, "t": target.astype(np.int64)}
    if weighted:
        feeds["w"] = rng.uniform(0.5, 2.0, shape[1]).astype(np.float32)
    return feeds


@pytest.mark.parametrize(("case", "op", "reduction", "weighted", "ignore", "shape"), LOSSES, ids=[c[0] for c in LOSSES])
def test_loss_matches_onnx_runtime_and_builds(
    case: str, op: str, reduction: str, weighted: bool, ignore: int | None, shape: list[int]
) -> None:
    model = loss_model(op, reduction, weighted, ignore, shape)
    assert "loss" in (rtx_build_error(model) or "")  # the parser has no importer for the loss
    after, result = apply(ClassLossToGather(), model)
    assert result.modified and op not in ops(after) and "GatherElements" in ops(after)
    assert_same_outputs(model, after, loss_feeds(shape, weighted, ignore), rtol=1e-6, atol=1e-6)
    assert rtx_build_error(after) is None


def test_cross_entropy_log_prob_output() -> None:
    model = parse(
        f"{HEADER}g (float[3,4] x, int64[3] t) => (float y, float[3,4] p) "
        '{ y, p = SoftmaxCrossEntropyLoss<reduction="mean">(x, t) }'
    )
    after, _ = apply(ClassLossToGather(), model)
    assert_same_outputs(model, after, loss_feeds([3, 4], False, None), rtol=1e-6, atol=1e-6)
    assert rtx_build_error(after) is None


def test_dynamic_batch() -> None:
    model = parse(
        f"{HEADER}g (float[N,4] x, int64[N] t) => (float y) "
        '{ y = NegativeLogLikelihoodLoss<reduction="mean", ignore_index=-100>(x, t) }'
    )
    after, _ = apply(ClassLossToGather(), model)
    for n in (1, 6):
        assert_same_outputs(model, after, loss_feeds([n, 4], False, None), rtol=1e-6, atol=1e-6)
    dims = [DynamicDim("x", 0, "N", 1, 4, 8), DynamicDim("t", 0, "N", 1, 4, 8)]
    assert rtx_build_error(after, dims) is None


def test_float_targets_are_left() -> None:
    """Probability targets are not class indices: the rule declines (the node is not a valid ONNX loss)."""
    model = onnx.parser.parse_model(
        f"{HEADER}g (float[3,4] x, float[3,4] t) => (float y) {{ y = SoftmaxCrossEntropyLoss(x, t) }}"
    )
    graph = gs.import_onnx(model)
    assert "class indices" in (ClassLossToGather().reason(graph.nodes[0], Facts(graph)) or "")


class Losses(torch.nn.Module):
    """nll_loss with weights and an ignored class, cross_entropy with label smoothing off, spatial targets."""

    def forward(self, x: torch.Tensor, t: torch.Tensor, w: torch.Tensor, s: torch.Tensor, st: torch.Tensor) -> tuple:
        nll = F.nll_loss(F.log_softmax(x, 1), t, weight=w, ignore_index=1)
        ce = F.cross_entropy(x, t, reduction="none")
        spatial = F.cross_entropy(s, st, reduction="sum")
        return nll, ce, spatial


def test_pytorch_losses_convert_match_and_build() -> None:
    torch.manual_seed(0)
    model = Losses().eval()
    sample = (torch.randn(6, 4), torch.tensor([0, 1, 3, 2, 1, 0]), torch.rand(4) + 0.5,
              torch.randn(2, 4, 3, 3), torch.randint(0, 4, (2, 3, 3)))  # fmt: skip
    module = pipeline.convert(model, sample, validate=False)  # 0-d outputs: compared here
    for got, want in zip(module(*sample), model(*sample), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert_builds(module)
