"""Bernoulli as ``Cast(Less(RandomUniformLike(p), p))``: the draw has PyTorch's distribution on ONNX Runtime (whose
own Bernoulli kernel draws the complement), a model sampling with ``torch.bernoulli`` converts and validates, and the
real TensorRT-RTX builder builds the rewrite (its parser has no Bernoulli)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from rtx_build import assert_builds, rtx_build_error
from test_parser_fixes_support import apply, ops, parse, run

import pipeline
from passes.parser_fixes import BernoulliAsUniform

PROBABILITIES = np.array([0.0, 0.05, 0.1, 0.5, 0.9, 1.0], np.float32)
DRAWS = 20_000  # per probability: a standard error of at most 0.0036 on the mean


def _bernoulli_graph(attrs: str = "", dtype: str = "float", out: str = "float") -> onnx.ModelProto:
    return parse(
        '<ir_version: 10, opset_import: ["" : 20]>\n'
        f"g ({dtype}[6,{DRAWS}] p) => ({out}[6,{DRAWS}] y) {{ y = Bernoulli{attrs}(p) }}"
    )


def _means(model: onnx.ModelProto, dtype: type = np.float32) -> np.ndarray:
    p = np.repeat(PROBABILITIES[:, None], DRAWS, axis=1).astype(dtype)
    (y,) = run(model, {"p": p})
    return np.asarray(y, np.float64).mean(axis=1)


def test_onnx_runtime_bernoulli_draws_the_complement_which_the_rewrite_corrects() -> None:
    """The reason for the rewrite, measured: if ONNX Runtime's kernel is ever fixed, the first assert says so."""
    model = _bernoulli_graph()
    assert np.abs(_means(model) - (1 - PROBABILITIES)).max() < 0.02  # ONNX Runtime 1.32: 1 with probability 1 - p
    after, result = apply(BernoulliAsUniform(), model)
    assert result.modified and ops(after) == ["RandomUniformLike", "Less", "Cast"]
    means = _means(after)
    assert means[0] == 0.0 and means[-1] == 1.0  # p = 0 never, p = 1 always
    np.testing.assert_allclose(means, PROBABILITIES, atol=0.02)


@pytest.mark.parametrize(("dtype", "numpy_dtype"), [("float16", np.float16), ("double", np.float64)])
def test_output_type_attribute_and_seed_are_kept(dtype: str, numpy_dtype: type) -> None:
    model = _bernoulli_graph("<dtype = 7, seed = 3.0>", dtype=dtype, out="int64")
    after, _ = apply(BernoulliAsUniform(), model)
    draw, _, cast = after.graph.node
    assert {a.name: onnx.helper.get_attribute_value(a) for a in draw.attribute}["seed"] == 3.0
    assert onnx.helper.get_attribute_value(cast.attribute[0]) == onnx.TensorProto.INT64
    p = np.repeat(PROBABILITIES[:, None], DRAWS, axis=1).astype(numpy_dtype)
    (first,), (second,) = run(after, {"p": p}), run(after, {"p": p})
    assert first.dtype == np.int64 and np.array_equal(first, second)  # seeded: the same draw twice
    np.testing.assert_allclose(first.mean(axis=1), PROBABILITIES, atol=0.02)


def test_tensorrt_rtx_builds_the_rewrite_and_not_the_node() -> None:
    model = _bernoulli_graph()
    assert (rtx_build_error(model) or "").startswith("parse:")  # the parser has no Bernoulli
    after, _ = apply(BernoulliAsUniform(), model)
    assert rtx_build_error(after) is None


class _Dropout(torch.nn.Module):
    """A sampled mask with a per-element probability, as stochastic-depth and diffusion samplers draw them."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        keep = torch.bernoulli(torch.sigmoid(x))
        return keep * x


@pytest.mark.parametrize("backend", ["onnxruntime", "tensorrt-rtx"])
def test_torch_bernoulli_converts_validates_and_keeps_the_distribution(backend: str) -> None:
    x = torch.full((64, 256), -2.1972)  # sigmoid(x) = 0.1: the complement would keep 90% of the elements
    torch.manual_seed(0)
    module = pipeline.convert(_Dropout(), x, backend=backend)
    assert module.report.accuracy is not None and module.report.accuracy.passed, module.report.summary()
    assert "Bernoulli" not in ops(module.onnx)
    kept = float((module(x) != 0).float().mean())
    assert abs(kept - 0.1) < 0.02, kept
    if backend == "tensorrt-rtx":
        assert_builds(module)
