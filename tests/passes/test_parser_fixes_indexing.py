"""MaxUnpool as ScatterElements and Compress as Gather: same numbers as ONNX Runtime's kernels, and left alone
when shapes, output_shape or the condition are not static."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from test_parser_fixes_support import apply, assert_same_outputs, assert_unchanged, created_names, ops, parse

from passes.parser_fixes.indexing import CompressToGather, MaxUnpoolToScatter

HEADER = '<ir_version: 10, opset_import: ["" : 20]>\n'

POOLING = [
    # (case, input shape, pooling attributes, unpooled shape)
    ("2-D, 2x2 stride 2", [2, 3, 4, 6], "kernel_shape=[2, 2], strides=[2, 2]", [2, 3, 4, 6]),
    ("2-D overlapping windows: repeated indices", [1, 2, 5, 5], "kernel_shape=[3, 3], strides=[1, 1]", [1, 2, 5, 5]),
    ("2-D with pads", [1, 1, 6, 6], "kernel_shape=[2, 2], strides=[2, 2], pads=[1, 1, 1, 1]", [1, 1, 6, 6]),
    ("1-D", [2, 2, 9], "kernel_shape=[3], strides=[3]", [2, 2, 9]),
    ("3-D", [1, 2, 4, 4, 4], "kernel_shape=[2, 2, 2], strides=[2, 2, 2]", [1, 2, 4, 4, 4]),
]


@pytest.mark.parametrize(("case", "shape", "attrs", "unpooled"), POOLING, ids=[p[0] for p in POOLING])
def test_max_unpool_after_max_pool(case: str, shape: list[int], attrs: str, unpooled: list[int]) -> None:
    dims = ",".join(map(str, shape))
    model = parse(
        f"{HEADER}g (float[{dims}] x) => (float[{','.join(map(str, unpooled))}] y) "
        f"{{ p, i = MaxPool<{attrs}>(x) y = MaxUnpool<{attrs}>(p, i) }}"
    )
    model.graph.node[1].name = "unpool"
    after, _ = apply(MaxUnpoolToScatter(), model)
    assert ops(after) == ["MaxPool", "ConstantOfShape", "Reshape", "Reshape", "ScatterElements", "Reshape"]
    assert len(created_names(after, "unpool")) == 5
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    x.reshape(-1)[:4] = [np.inf, -np.inf, 1e30, -0.0]
    assert_same_outputs(model, after, {"x": x})


def test_max_unpool_with_output_shape() -> None:
    model = parse(
        f"{HEADER}g (float[1,1,2,2] x, int64[1,1,2,2] i) => (float[1,1,5,5] y) <int64[4] s = {{1,1,5,5}}> "
        "{ y = MaxUnpool<kernel_shape=[2,2], strides=[2,2]>(x, i, s) }"
    )
    after, _ = apply(MaxUnpoolToScatter(), model)
    assert "MaxUnpool" not in ops(after)
    feeds = {"x": np.array([[[[1.5, -2.0], [np.nan, 4.0]]]], np.float32), "i": np.array([[[[0, 3], [10, 24]]]])}
    (y,) = assert_same_outputs(model, after, feeds)
    assert y[0, 0, 0, 3] == -2.0 and y[0, 0, 4, 4] == 4.0 and np.isnan(y[0, 0, 2, 0])


def test_max_unpool_float64_on_the_reference_evaluator() -> None:
    """ONNX Runtime has no float64 MaxUnpool; the ONNX reference evaluator runs both graphs."""
    model = parse(
        f"{HEADER}g (double[1,2,4,4] x) => (double[1,2,4,4] y) "
        "{ p, i = MaxPool<kernel_shape=[2,2], strides=[2,2]>(x) "
        "  y = MaxUnpool<kernel_shape=[2,2], strides=[2,2]>(p, i) }"
    )
    after, _ = apply(MaxUnpoolToScatter(), model)
    assert "MaxUnpool" not in ops(after)
    x = np.random.default_rng(0).standard_normal((1, 2, 4, 4))
    assert_same_outputs(model, after, {"x": x}, reference=True)


@pytest.mark.parametrize(
    ("case", "text"),
    [
        ("dynamic input", "g (float[N,1,2,2] x, int64[N,1,2,2] i) => (float[N,1,4,4] y) "
         "{ y = MaxUnpool<kernel_shape=[2,2], strides=[2,2]>(x, i) }"),
        ("output_shape an input", "g (float[1,1,2,2] x, int64[1,1,2,2] i, int64[4] s) => (float[1,1,A,B] y) "
         "{ y = MaxUnpool<kernel_shape=[2,2], strides=[2,2]>(x, i, s) }"),
    ],
)  # fmt: skip
def test_max_unpool_left_unchanged(case: str, text: str) -> None:
    assert_unchanged(MaxUnpoolToScatter(), onnx.parser.parse_model(HEADER + text))


COMPRESS = [
    # (case, input type, condition, axis attribute, output type, ops after)
    ("axis 0", "float[4,3]", [1, 0, 1, 1], "<axis=0>", "float[3,3]", ["Gather"]),
    ("axis -1, shorter condition", "float[2,5]", [0, 1, 1], "<axis=-1>", "float[2,2]", ["Gather"]),
    ("no axis: flattened", "float[2,3]", [1, 0, 0, 1, 1], "", "float[3]", ["Reshape", "Gather"]),
    ("nothing selected", "float[4,3]", [0, 0, 0, 0], "<axis=0>", "float[0,3]", ["Gather"]),
    ("int64, dynamic batch", "int64[N,4]", [1, 1, 0, 1], "<axis=1>", "int64[N,3]", ["Gather"]),
    ("bool", "bool[3,2]", [0, 1, 1], "<axis=0>", "bool[2,2]", ["Gather"]),
]


@pytest.mark.parametrize(
    ("case", "inp", "condition", "attrs", "out", "expected"), COMPRESS, ids=[c[0] for c in COMPRESS]
)
def test_compress(case: str, inp: str, condition: list[int], attrs: str, out: str, expected: list[str]) -> None:
    values = ",".join(map(str, condition))
    model = parse(
        f"{HEADER}g ({inp} x) => ({out} y) <bool[{len(condition)}] c = {{{values}}}> {{ y = Compress{attrs}(x, c) }}"
    )
    after, _ = apply(CompressToGather(), model)
    assert ops(after) == expected
    dims = tuple(int(d) if d.isdigit() else 3 for d in inp[inp.index("[") + 1 : -1].split(","))
    rng = np.random.default_rng(0)
    if inp.startswith("float"):
        x = rng.standard_normal(dims).astype(np.float32)
        x.reshape(-1)[:3] = [np.nan, np.inf, -0.0]
    elif inp.startswith("int64"):
        x = rng.integers(-(2**62), 2**62, dims, dtype=np.int64)
    else:
        x = rng.random(dims) > 0.5
    assert_same_outputs(model, after, {"x": x})


@pytest.mark.parametrize(
    ("case", "text"),
    [
        ("condition an input", "g (float[4,3] x, bool[4] c) => (float[N,3] y) { y = Compress<axis=0>(x, c) }"),
        ("condition longer than the axis",
         "g (float[2,3] x) => (float[N,3] y) <bool[3] c = {1,1,1}> { y = Compress<axis=0>(x, c) }"),
    ],
)  # fmt: skip
def test_compress_left_unchanged(case: str, text: str) -> None:
    assert_unchanged(CompressToGather(), onnx.parser.parse_model(HEADER + text))
