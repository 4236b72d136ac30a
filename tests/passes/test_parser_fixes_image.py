"""CenterCropPad as Slice/Pad, AffineGrid as MatMul with a base grid, Col2Im as Gather + ReduceSum: same numbers as
ONNX Runtime's own kernels (edge values included), and left alone when shapes or sizes are not static."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from test_parser_fixes_support import apply, assert_same_outputs, assert_unchanged, created_names, ops, parse

from passes.parser_fixes.col2im import Col2ImToGather
from passes.parser_fixes.image import AffineGridToMatMul, CenterCropPadToSlicePad
from passes.rules import Facts

HEADER = '<ir_version: 10, opset_import: ["" : 20]>\n'


def special_values(shape: tuple[int, ...], dtype: str = "float32") -> np.ndarray:
    """Random values with inf, -inf, NaN, -0.0 and the largest finite value mixed in."""
    x = np.random.default_rng(0).standard_normal(shape).astype(dtype).reshape(-1)
    if np.issubdtype(x.dtype, np.floating):
        specials = np.array([np.inf, -np.inf, np.nan, -0.0, np.finfo(x.dtype).max], x.dtype)
        x[(np.arange(specials.size) * 7) % x.size] = specials
    return x.reshape(shape)


CROP_PAD = [
    # (case, input type, output type, shape values, axes attribute, ops after)
    ("crop both, odd and even", "float[7,8]", "float[4,5]", [4, 5], None, ["Slice"]),
    ("pad both, odd and even", "float[3,4]", "float[6,7]", [6, 7], None, ["Pad"]),
    ("crop one, pad the other", "float[2,7,4]", "float[2,3,9]", [3, 9], "axes=[1, -1]", ["Slice", "Pad"]),
    ("same size", "float[3,4]", "float[3,4]", [3, 4], None, ["Identity"]),
    ("dynamic batch", "float[B,6,6]", "float[B,3,8]", [3, 8], "axes=[1, 2]", ["Slice", "Pad"]),
    ("int64", "int64[5,5]", "int64[2,8]", [2, 8], None, ["Slice", "Pad"]),
    ("bool crop only", "bool[5,5]", "bool[2,3]", [2, 3], None, ["Slice"]),
]


@pytest.mark.parametrize(("case", "inp", "out", "sizes", "axes", "expected"), CROP_PAD, ids=[c[0] for c in CROP_PAD])
def test_center_crop_pad(
    case: str, inp: str, out: str, sizes: list[int], axes: str | None, expected: list[str]
) -> None:
    attrs = f"<{axes}>" if axes else ""
    shape = ",".join(map(str, sizes))
    model = parse(
        f"{HEADER}g ({inp} x) => ({out} y) <int64[{len(sizes)}] s = {{{shape}}}> {{ y = CenterCropPad{attrs}(x, s) }}"
    )
    model.graph.node[0].name = "ccp"
    after, _ = apply(CenterCropPadToSlicePad(), model)
    assert ops(after) == expected
    assert len(created_names(after, "ccp")) == len(expected)
    dims = tuple(int(d) if d.isdigit() else 2 for d in inp[inp.index("[") + 1 : -1].split(","))
    dtype = inp[: inp.index("[")].replace("float", "float32")
    x = special_values(dims, dtype) if dtype != "bool" else np.random.default_rng(0).random(dims) > 0.5
    assert_same_outputs(model, after, {"x": x})


@pytest.mark.parametrize(
    ("case", "text"),
    [
        ("dynamic cropped axis", "g (float[N,4] x) => (float[2,4] y) <int64[2] s = {2,4}> { y = CenterCropPad(x, s) }"),
        ("shape an input", "g (float[3,4] x, int64[2] s) => (float[A,B] y) { y = CenterCropPad(x, s) }"),
        ("bool padded", "g (bool[2,2] x) => (bool[4,4] y) <int64[2] s = {4,4}> { y = CenterCropPad(x, s) }"),
    ],
)
def test_center_crop_pad_left_unchanged(case: str, text: str) -> None:
    model = onnx.parser.parse_model(HEADER + text)
    assert_unchanged(CenterCropPadToSlicePad(), model)


AFFINE_GRID = [
    ("float[2,2,3]", [2, 3, 4, 5], 0),
    ("float[2,2,3]", [2, 3, 4, 5], 1),
    ("float[N,2,3]", [3, 1, 1, 6], 0),  # theta's batch dynamic, a unit-size axis
    ("float[1,3,4]", [1, 2, 3, 4, 5], 0),
    ("float[1,3,4]", [1, 2, 3, 4, 5], 1),
]


@pytest.mark.parametrize(("theta", "size", "align"), AFFINE_GRID)
def test_affine_grid(theta: str, size: list[int], align: int) -> None:
    k = len(size) - 2
    out = f"float[{','.join(map(str, [size[0], *size[2:], k]))}]"
    model = parse(
        f"{HEADER}g ({theta} t) => ({out} y) <int64[{len(size)}] s = {{{','.join(map(str, size))}}}> "
        f"{{ y = AffineGrid<align_corners={align}>(t, s) }}"
    )
    after, _ = apply(AffineGridToMatMul(), model)
    assert ops(after) == ["Transpose", "MatMul", "Reshape"]
    t = np.random.default_rng(1).standard_normal((size[0], k, k + 1)).astype(np.float32)
    t[0, 0, 0] = 1e30  # large entries scale straight through
    assert_same_outputs(model, after, {"t": t}, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    ("case", "text"),
    [
        ("size an input", "g (float[2,2,3] t, int64[4] s) => (float[2,A,B,2] y) { y = AffineGrid(t, s) }"),
        (
            "unit size with align_corners",
            "g (float[2,2,3] t) => (float[2,1,3,2] y) <int64[4] s = {2,1,1,3}> "
            "{ y = AffineGrid<align_corners=1>(t, s) }",
        ),
    ],
)
def test_affine_grid_left_unchanged(case: str, text: str) -> None:
    assert_unchanged(AffineGridToMatMul(), onnx.parser.parse_model(HEADER + text))


def col2im_model(n: str, image: list[int], block: list[int], attrs: dict[str, list[int]], channels: int = 3) -> str:
    s = len(image)
    d, p, st = attrs.get("dilations", [1] * s), attrs.get("pads", [0] * 2 * s), attrs.get("strides", [1] * s)
    counts = [(image[i] + p[i] + p[s + i] - d[i] * (block[i] - 1) - 1) // st[i] + 1 for i in range(s)]
    kernel, blocks = int(np.prod(block)), int(np.prod(counts))
    text_attrs = ", ".join(f"{k}={v}" for k, v in attrs.items())
    out = f"float[{','.join(map(str, [n, channels, *image]))}]"
    return (
        f"{HEADER}g (float[{n},{channels * kernel},{blocks}] x) => ({out} y) "
        f"<int64[{s}] im = {{{','.join(map(str, image))}}}, int64[{s}] bl = {{{','.join(map(str, block))}}}> "
        f"{{ y = Col2Im{f'<{text_attrs}>' if attrs else ''}(x, im, bl) }}"
    )


COL2IM = [
    ("overlapping 2-D", [5, 5], [2, 2], {}, ["Reshape", "Pad", "Gather", "ReduceSum", "Reshape"]),
    (
        "strides, pads, dilations",
        [6, 7],
        [3, 2],
        {"strides": [2, 1], "pads": [1, 0, 1, 2], "dilations": [1, 2]},
        ["Reshape", "Pad", "Gather", "ReduceSum", "Reshape"],
    ),
    ("1-D", [8], [3], {"strides": [2], "pads": [1, 1]}, ["Reshape", "Pad", "Gather", "ReduceSum", "Reshape"]),
    ("3-D", [4, 4, 4], [2, 2, 2], {"strides": [2, 1, 2]}, ["Reshape", "Pad", "Gather", "ReduceSum", "Reshape"]),
    ("tiles: one source per pixel", [4, 6], [2, 3], {"strides": [2, 3]}, ["Reshape", "Gather", "Reshape"]),
    ("gaps: some pixels get nothing", [5, 5], [1, 2], {"strides": [2, 3]}, ["Reshape", "Pad", "Gather", "Reshape"]),
]


@pytest.mark.parametrize(("case", "image", "block", "attrs", "expected"), COL2IM, ids=[c[0] for c in COL2IM])
def test_col2im(
    case: str, image: list[int], block: list[int], attrs: dict[str, list[int]], expected: list[str]
) -> None:
    model = parse(col2im_model("2", image, block, attrs))
    after, _ = apply(Col2ImToGather(), model)
    assert ops(after) == expected
    x = special_values(tuple(d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim))
    assert_same_outputs(model, after, {"x": x}, rtol=1e-6, atol=1e-6)


def test_col2im_dynamic_batch() -> None:
    model = parse(col2im_model("N", [5, 5], [2, 2], {}))
    after, _ = apply(Col2ImToGather(), model)
    assert "Col2Im" not in ops(after)
    dims = tuple(d.dim_value or 3 for d in model.graph.input[0].type.tensor_type.shape.dim)
    assert_same_outputs(model, after, {"x": special_values(dims)}, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    ("case", "text"),
    [
        (
            "dynamic block count",
            "g (float[1,12,L] x) => (float[1,3,5,5] y) <int64[2] im = {5,5}, int64[2] bl = {2,2}> "
            "{ y = Col2Im(x, im, bl) }",
        ),
        ("image_shape an input", "g (float[1,12,16] x, int64[2] im) => (float[1,3,A,B] y) <int64[2] bl = {2,2}> "
         "{ y = Col2Im(x, im, bl) }"),
    ],
)  # fmt: skip
def test_col2im_left_unchanged(case: str, text: str) -> None:
    model = onnx.parser.parse_model(HEADER + text)
    assert_unchanged(Col2ImToGather(), model)
    graph = gs.import_onnx(model)
    assert isinstance(Col2ImToGather().check(graph.nodes[0], Facts(graph)), str)


def test_col2im_float64_on_the_reference_evaluator() -> None:
    """ONNX Runtime's Col2Im is float32 only; the ONNX reference evaluator runs both graphs."""
    model = parse(
        col2im_model("2", [6, 7], [3, 2], {"strides": [2, 1], "pads": [1, 0, 1, 2]}).replace("float", "double")
    )
    after, _ = apply(Col2ImToGather(), model)
    assert "Col2Im" not in ops(after)
    dims = tuple(d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim)
    assert_same_outputs(model, after, {"x": special_values(dims, "float64")}, rtol=1e-12, reference=True)
