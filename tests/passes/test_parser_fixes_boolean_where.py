"""``Where`` on bool data (``mask.masked_fill(cond, False)``, HunyuanVideo's attention mask) as And/Or/Not: ONNX
Runtime's CPU provider has no bool Where and refuses the whole graph; the rewrite runs on it, gives Where's values
for every combination and broadcast, and the real TensorRT-RTX builder builds it; a module that masks a bool mask
converts, matches PyTorch and builds."""

from __future__ import annotations

import itertools

import numpy as np
import onnxruntime as ort
import pytest
import torch
from rtx_build import assert_builds, rtx_build_error
from test_parser_fixes_support import apply, assert_unchanged, ops, parse

import pipeline
from passes.parser_fixes.boolean_where import BooleanWhereAsLogic
from passes.rules import RulePass

FIX = RulePass("boolean_where_as_logic", (BooleanWhereAsLogic(),))
HEADER = '<ir_version: 10, opset_import: ["" : 20]>\n'


def _run(model: object, feeds: dict[str, np.ndarray]) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])  # type: ignore[attr-defined]
    return np.asarray(session.run(None, feeds)[0])


def _all_bools(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 2, shape).astype(bool)


def test_variable_data_broadcast_like_where() -> None:
    model = parse(HEADER + "g (bool[2, 1, 4] c, bool[3, 1] x, bool[4] y) => (bool[2, 3, 4] z) { z = Where(c, x, y) }")
    with pytest.raises(Exception, match="Could not find an implementation for Where"):
        _run(model, {})
    after, _ = apply(FIX, model)
    assert ops(after) == ["And", "Not", "And", "Or"]
    feeds = {"c": _all_bools((2, 1, 4), 0), "x": _all_bools((3, 1), 1), "y": _all_bools((4,), 2)}
    z = _run(after, feeds)
    np.testing.assert_array_equal(z, np.where(feeds["c"], feeds["x"], feeds["y"]))
    assert rtx_build_error(after) is None


@pytest.mark.parametrize(("side", "value"), list(itertools.product(("x", "y"), (True, False))))
def test_one_constant_value_shortened(side: str, value: bool) -> None:
    constant = f"k = Constant <value = bool {{{int(value)}}}> ()"
    args = "c, k, v" if side == "x" else "c, v, k"
    model = parse(HEADER + f"g (bool[2, 3] c, bool[3] v) => (bool[2, 3] z) {{ {constant}\n z = Where({args}) }}")
    after, _ = apply(FIX, model)
    assert "Where" not in ops(after) and len([o for o in ops(after) if o != "Constant"]) <= 2
    c, v = _all_bools((2, 3), 3), _all_bools((3,), 4)
    expected = np.where(c, value, v) if side == "x" else np.where(c, v, value)
    np.testing.assert_array_equal(_run(after, {"c": c, "v": v}), expected)


def test_constant_that_raises_the_rank_keeps_its_shape() -> None:
    constant = "k = Constant <value = bool[1, 1, 1] {0}> ()"
    model = parse(HEADER + f"g (bool[3] c, bool[3] v) => (bool[1, 1, 3] z) {{ {constant}\n z = Where(c, v, k) }}")
    after, _ = apply(FIX, model)
    c, v = _all_bools((3,), 5), _all_bools((3,), 6)
    z = _run(after, {"c": c, "v": v})
    assert z.shape == (1, 1, 3)
    np.testing.assert_array_equal(z, np.where(c, v, False)[None, None])


def test_float_data_left_alone() -> None:
    assert_unchanged(
        FIX, parse(HEADER + "g (bool[3] c, float[3] x, float[3] y) => (float[3] z) { z = Where(c, x, y) }")
    )


class _MaskedMask(torch.nn.Module):
    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        mask = (x > 0).masked_fill(~keep, False)
        return torch.where(mask, x, -x)


def test_masked_bool_mask_converts_matches_and_builds() -> None:
    x = torch.randn(2, 5, generator=torch.Generator().manual_seed(0))
    keep = torch.tensor([[True, False, True, True, False]] * 2)
    module = pipeline.convert(_MaskedMask().eval(), (x, keep))
    torch.testing.assert_close(module(x, keep), _MaskedMask()(x, keep))
    assert_builds(module)
