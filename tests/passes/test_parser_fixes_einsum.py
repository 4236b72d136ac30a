"""Einsum equations with capitals, spaces or an implicit output rewritten for TensorRT's parser: the real
TensorRT-RTX parser rejects the original and builds the rewrite, ONNX Runtime gives the same numbers, and a
MaxViT-style attention written with ``torch.einsum("B G N E, B G M E -> B G N M")`` converts, matches PyTorch and
builds."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from rtx_build import assert_builds, rtx_build_error
from test_parser_fixes_support import apply, assert_same_outputs, assert_unchanged, parse

import pipeline
from passes.parser_fixes.einsum import EinsumEquationForParser, normalized_equation


def einsum_model(equation: str) -> str:
    return (
        '<ir_version: 10, opset_import: ["" : 20]>\n'
        "g (float[2,3,4] a, float[2,5,4] b) => (float[2,3,5] y) {\n"
        f'  y = Einsum<equation="{equation}">(a, b)\n'
        "}"
    )


@pytest.mark.parametrize(
    ("equation", "expected"),
    [
        ("B N E, B M E -> B N M", "bne,bme->bnm"),
        ("bne,bme->bnm", "bne,bme->bnm"),
        ("bNe,bMe->bNM", "bne,bme->bnm"),
        ("ij,jk", "ij,jk->ik"),
        ("Ba,Ab", "da,cb->cdab"),  # implicit output: alphabetical over the ORIGINAL letters (A, B, a, b)
        ("...ij,...jk->...ik", None),
    ],
)
def test_normalized_equation(equation: str, expected: str | None) -> None:
    assert normalized_equation(equation) == expected


def test_parser_rejects_the_original_and_builds_the_rewrite() -> None:
    model = parse(einsum_model("B N E, B M E -> B N M"))
    error = rtx_build_error(model)
    assert error is not None and "Einsum" in error
    after, result = apply(EinsumEquationForParser(), model)
    assert result.modified
    assert [a.s.decode() for a in after.graph.node[0].attribute] == ["bne,bme->bnm"]
    rng = np.random.default_rng(0)
    feeds = {"a": rng.standard_normal((2, 3, 4), np.float32), "b": rng.standard_normal((2, 5, 4), np.float32)}
    assert_same_outputs(model, after, feeds)
    assert rtx_build_error(after) is None


def test_parser_form_is_left_alone() -> None:
    assert_unchanged(EinsumEquationForParser(), parse(einsum_model("bne,bme->bnm")))


class GroupedAttention(torch.nn.Module):
    """Attention over window groups with capital, spaced subscripts, as torchvision's MaxViT writes it."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(8, 24)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = torch.einsum("B G P N E, B G P M E -> B G P N M", q, k).softmax(-1)
        return torch.einsum("B G P N M, B G P M E -> B G P N E", scores, v)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_pytorch_model_converts_and_builds(precision: str) -> None:
    torch.manual_seed(0)
    model = GroupedAttention().eval()
    module = pipeline.convert(model, torch.randn(1, 2, 3, 4, 8), precision=precision)
    equations = {a.s.decode() for n in module.onnx.graph.node if n.op_type == "Einsum" for a in n.attribute}
    assert equations and all(e == e.lower() and " " not in e for e in equations), equations
    assert_builds(module)
