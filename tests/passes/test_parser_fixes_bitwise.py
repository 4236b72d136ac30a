"""BitShift and Bitwise* with constant operands as INT32/INT64 arithmetic: exact on edge values (ONNX Runtime, and
the ONNX reference evaluator for opset 28's signed BitShift), and left alone where no exact rewrite exists."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
import torch
from test_parser_fixes_support import apply, assert_same_outputs, assert_unchanged, created_names, ops, parse

import pipeline
from passes.parser_fixes.bitwise import BitwiseToArithmetic
from passes.rules import Facts

REJECTED = {"BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot"}


def edge_values(dtype: np.dtype) -> np.ndarray:
    """Both ends of the range, around zero and the middle, and random values."""
    info = np.iinfo(dtype)
    values = [info.min, info.min + 1, info.min // 2 - 1, info.min // 2, -3, -2, -1, 0, 1, 2, 3]
    values += [info.max // 2, info.max // 2 + 1, info.max - 1, info.max]
    rng = np.random.default_rng(0)
    values += [int(v) for v in rng.integers(info.min, info.max, 48, dtype=dtype, endpoint=True)]
    return np.array(sorted({v for v in values if info.min <= v <= info.max}), dtype=dtype)


def tensor_type(dtype: np.dtype) -> int:
    return onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def mask_values(bits: int) -> list[int]:
    """Masks as N-bit patterns: empty, full, low runs (Mod), high runs, single bits, alternating, sign bit."""
    full = (1 << bits) - 1
    alternating = int("01" * (bits // 2), 2)
    masks = {0, full, 1, 2, 3, 7, 0xF0, 0x0F0F, alternating, full ^ alternating, 1 << (bits - 1), full >> 1}
    masks |= {full ^ 15, full ^ 1, (1 << (bits - 2)) | 1, 0b1011_0110}
    return sorted(m & full for m in masks)


def shift_model(signed: str, unsigned: str, bits: int) -> onnx.ModelProto:
    """What the exporter writes for ``x << s`` / ``x >> s`` on int tensors: Cast to unsigned, BitShift, Cast back;
    every shift amount, both directions; some unsigned results are graph outputs themselves."""
    lines, outputs, constants = [], [], []
    for direction in ("LEFT", "RIGHT"):
        for s in range(bits):
            name = f"{direction.lower()}{s}"
            constants.append(f"{unsigned} s_{name} = {{{s}}}")
            lines.append(f'u_{name} = BitShift<direction="{direction}">(xu, s_{name})')
            lines.append(f"y_{name} = Cast<to={tensor_type(np.dtype(signed))}>(u_{name})")
            outputs.append(f"{signed}[N] y_{name}")
            if s % 9 == 0:
                outputs.append(f"{unsigned}[N] u_{name}")
    return parse(
        f'<ir_version: 10, opset_import: ["" : 20]>\ng ({signed}[N] x) => ({", ".join(outputs)}) '
        f"<{', '.join(constants)}> {{ xu = Cast<to={tensor_type(np.dtype(unsigned))}>(x) {' '.join(lines)} }}"
    )


@pytest.mark.parametrize(("signed", "unsigned", "bits"), [("int32", "uint32", 32), ("int64", "uint64", 64)])
def test_exported_shift_pattern_every_shift_amount(signed: str, unsigned: str, bits: int) -> None:
    model = shift_model(signed, unsigned, bits)
    after, result = apply(BitwiseToArithmetic(), model)
    assert result.modified
    assert not REJECTED & set(ops(after))
    # Only the unsigned graph outputs keep a Cast to unsigned; each Cast back to signed became an Identity.
    to_unsigned = [n for n in after.graph.node if n.op_type == "Cast" and n.attribute[0].i == tensor_type(unsigned)]
    assert len(to_unsigned) == sum(o.type.tensor_type.elem_type == tensor_type(unsigned) for o in after.graph.output)
    counts = Counter(ops(after))
    assert counts["Identity"] >= 2 * bits - 1
    assert set(counts) <= {"Mod", "Div", "Mul", "Add", "Sub", "Neg", "Less", "Cast", "Identity"}
    assert_same_outputs(model, after, {"x": edge_values(np.dtype(signed))})


def bitwise_model(dtype: str, bits: int, opset: int = 20) -> onnx.ModelProto:
    """Every mask of ``mask_values`` with And/Or/Xor (the constant on either side), and Not."""
    lines, outputs, constants = ["y_not = BitwiseNot(x)"], [f"{dtype}[N] y_not"], []
    np_dtype = np.dtype(dtype)
    for i, mask in enumerate(mask_values(bits)):
        value = mask - (1 << bits) if np.issubdtype(np_dtype, np.signedinteger) and mask >> (bits - 1) else mask
        constants.append(f"{dtype} m{i} = {{{value}}}")
        for op in ("And", "Or", "Xor"):
            operands = f"x, m{i}" if i % 2 else f"m{i}, x"
            lines.append(f"y_{op}{i} = Bitwise{op}({operands})")
            outputs.append(f"{dtype}[N] y_{op}{i}")
    return parse(
        f'<ir_version: 10, opset_import: ["" : {opset}]>\ng ({dtype}[N] x) => ({", ".join(outputs)}) '
        f"<{', '.join(constants)}> {{ {' '.join(lines)} }}"
    )


@pytest.mark.parametrize(("dtype", "bits"), [("int32", 32), ("int64", 64), ("uint8", 8)])
def test_bitwise_with_constant_masks(dtype: str, bits: int) -> None:
    model = bitwise_model(dtype, bits)
    after, result = apply(BitwiseToArithmetic(), model)
    assert result.modified and not REJECTED & set(ops(after))
    assert set(ops(after)) <= {"Mod", "Mul", "Add", "Sub", "Less", "Cast", "Identity"}
    x = edge_values(np.dtype(dtype)) if dtype != "uint8" else np.arange(256, dtype=np.uint8)
    assert_same_outputs(model, after, {"x": x})


def test_and_with_low_mask_is_one_mod_named_after_the_node() -> None:
    model = parse(
        '<ir_version: 10, opset_import: ["" : 18]>\n'
        "g (int64[2,3] x) => (int64[2,3] y) <int64 m = {15}> { y = BitwiseAnd(x, m) }"
    )
    model.graph.node[0].name = "mask_low"
    after, _ = apply(BitwiseToArithmetic(), model)
    assert ops(after) == ["Mod"]
    assert created_names(after, "mask_low") == ["mask_low/Mod"]
    assert [n.output[0] for n in after.graph.node] == ["y"]
    x = np.array([[-17, -16, -1], [0, 15, 16]], np.int64)
    (y,) = assert_same_outputs(model, after, {"x": x})
    np.testing.assert_array_equal(y, x & 15)


def test_or_with_zero_keeps_the_output_tensor_through_an_identity() -> None:
    model = parse(
        '<ir_version: 10, opset_import: ["" : 18]>\n'
        "g (int32[3] x) => (int32[3] y) <int32 zero = {0}> { y = BitwiseOr(x, zero) }"
    )
    after, _ = apply(BitwiseToArithmetic(), model)
    assert ops(after) == ["Identity"] and [o.name for o in after.graph.output] == ["y"]
    assert_same_outputs(model, after, {"x": np.array([-1, 0, 7], np.int32)})


def test_uint8_shift_between_graph_inputs_and_outputs() -> None:
    """uint8 (image bytes): Cast to int32, arithmetic, Cast back, which the parser accepts at graph I/O."""
    lines, outputs, constants = [], [], []
    for direction in ("LEFT", "RIGHT"):
        for s in range(8):
            constants.append(f"uint8 s{direction}{s} = {{{s}}}")
            lines.append(f'y{direction}{s} = BitShift<direction="{direction}">(x, s{direction}{s})')
            outputs.append(f"uint8[256] y{direction}{s}")
    model = parse(
        f'<ir_version: 10, opset_import: ["" : 18]>\ng (uint8[256] x) => ({", ".join(outputs)}) '
        f"<{', '.join(constants)}> {{ {' '.join(lines)} }}"
    )
    after, _ = apply(BitwiseToArithmetic(), model)
    assert set(ops(after)) <= {"Cast", "Mod", "Mul", "Div", "Identity"}
    assert_same_outputs(model, after, {"x": np.arange(256, dtype=np.uint8)})


@pytest.mark.parametrize(("dtype", "bits"), [("int32", 32), ("int64", 64)])
def test_signed_bitshift_of_opset_28_on_the_reference_evaluator(dtype: str, bits: int) -> None:
    """Opset 28 defines BitShift on signed types (arithmetic right shift); ONNX Runtime 1.31 reads opset <= 26."""
    lines, outputs, constants = [], [], []
    for direction in ("LEFT", "RIGHT"):
        for s in (0, 1, 2, 5, bits // 2, bits - 2, bits - 1):
            constants.append(f"{dtype} s{direction}{s} = {{{s}}}")
            lines.append(f'y{direction}{s} = BitShift<direction="{direction}">(x, s{direction}{s})')
            outputs.append(f"{dtype}[N] y{direction}{s}")
    model = onnx.parser.parse_model(
        f'<ir_version: 10, opset_import: ["" : 28]>\ng ({dtype}[N] x) => ({", ".join(outputs)}) '
        f"<{', '.join(constants)}> {{ {' '.join(lines)} }}"
    )
    after, _ = apply(BitwiseToArithmetic(), model)
    assert not REJECTED & set(ops(after))
    x = edge_values(np.dtype(dtype))
    got = assert_same_outputs(model, after, {"x": x}, reference=True)
    np.testing.assert_array_equal(got[outputs.index(f"{dtype}[N] yRIGHT1")], x >> 1)  # numpy: arithmetic shift


@pytest.mark.parametrize(
    ("case", "text"),
    [
        ("variable mask", "g (int64[4] x, int64[4] m) => (int64[4] y) { y = BitwiseAnd(x, m) }"),
        ("several mask values", "g (int64[4] x) => (int64[4] y) <int64[4] m = {1, 2, 3, 4}> { y = BitwiseOr(x, m) }"),
        ("mask broadcasts x", "g (int64[4] x) => (int64[1,4] y) <int64[1,1] m = {3}> { y = BitwiseXor(x, m) }"),
        ("int16 operand", "g (int16[4] x) => (int16[4] y) <int16 m = {3}> { y = BitwiseAnd(x, m) }"),
        ("uint16 shift", 'g (uint16[4] x) => (uint16[4] y) <uint16 s = {3}> { y = BitShift<direction="LEFT">(x, s) }'),
        ("uint64 not from a Cast", "g (uint64[4] x) => (uint64[4] y) { y = BitwiseNot(x) }"),
        ("variable shift", 'g (uint8[4] x, uint8[4] s) => (uint8[4] y) { y = BitShift<direction="LEFT">(x, s) }'),
        ("shift >= bits", 'g (uint8[4] x) => (uint8[4] y) <uint8 s = {8}> { y = BitShift<direction="RIGHT">(x, s) }'),
    ],
)
def test_left_unchanged_without_an_exact_rewrite(case: str, text: str) -> None:
    model = parse(f'<ir_version: 10, opset_import: ["" : 18]>\n{text}')
    assert_unchanged(BitwiseToArithmetic(), model)
    graph = gs.import_onnx(model)
    reason = BitwiseToArithmetic().check(graph.nodes[0], Facts(graph))
    assert isinstance(reason, str), case


class IntegerBitOps(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return x << 3, x >> 2, x & 7, x | 8, x ^ 5, ~x, x & -16


def test_torch_integer_bit_ops_convert_without_bitwise_nodes() -> None:
    model = IntegerBitOps().eval()
    info = np.iinfo(np.int64)
    edges = [info.min, info.min + 1, info.min // 2, -(2**40), -9, -2, -1, 0, 1, 2, 9, 2**40, info.max // 2, info.max]
    sample = torch.tensor(edges, dtype=torch.int64)
    module = pipeline.convert(model, sample, backend="onnxruntime")
    assert not REJECTED & {n.op_type for n in module.onnx.graph.node}
    for x in (sample, sample.flip(0) // 3):
        for got, expected in zip(module(x), model(x), strict=True):
            torch.testing.assert_close(got, expected, rtol=0, atol=0)
