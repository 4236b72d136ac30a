"""DFT as MatMul with a constant DFT matrix: every mode against ONNX Runtime's DFT, and PyTorch models (rfft, fft
of complex-as-real input, irfft) through the whole pipeline to a graph without DFT."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
import torch
from test_parser_fixes_support import apply, assert_same_outputs, assert_unchanged, created_names, ops, parse

import pipeline
from passes.parser_fixes import dft
from passes.parser_fixes.dft import DftToMatMul
from passes.rules import Facts


def signals(shape: tuple[int, ...], dtype: str = "float32") -> np.ndarray:
    """Random rows plus the edge rows of a DFT: zeros, an impulse, a constant (all in bin 0), an alternating sign
    (all in the Nyquist bin) and large magnitudes; ``shape[0]`` must be at least 6."""
    x = np.random.default_rng(0).standard_normal(shape)
    x[0] = 0.0
    x[1] = 0.0
    x[(1,) + (0,) * (len(shape) - 1)] = 1.0
    x[2] = 1.0
    x[3] = np.where(np.indices(shape[1:]).sum(axis=0) % 2 == 0, 1.0, -1.0)
    x[4] *= 1e6
    return x.astype(dtype)


MODES = [
    # (case, input type, output type, attributes, dft_length, axis)
    ("real forward", "float[6,8,1]", "float[6,8,2]", "", None, 1),
    ("complex forward", "float[6,8,2]", "float[6,8,2]", "", None, -2),
    ("rfft even", "float[6,8,1]", "float[6,5,2]", "onesided=1", None, 1),
    ("rfft odd", "float[6,9,1]", "float[6,5,2]", "onesided=1", None, 1),
    ("rfft zero-padded", "float[6,8,1]", "float[6,7,2]", "onesided=1", 12, 1),
    ("truncated", "float[6,8,2]", "float[6,5,2]", "", 5, 1),
    ("complex inverse", "float[6,8,2]", "float[6,8,2]", "inverse=1", None, 1),
    ("real inverse", "float[6,7,1]", "float[6,7,2]", "inverse=1", None, 1),
    ("inverse zero-padded", "float[6,5,2]", "float[6,9,2]", "inverse=1", 9, 1),
    ("irfft default length", "float[6,5,2]", "float[6,8,1]", "inverse=1, onesided=1", None, 1),
    ("irfft odd length", "float[6,5,2]", "float[6,9,1]", "inverse=1, onesided=1", 9, 1),
    ("first of two axes", "float[6,8,3,2]", "float[6,8,3,2]", "", None, 1),
    ("batch axis 0", "float[6,4,2]", "float[6,4,2]", "inverse=1", None, 0),
    ("rank 2", "float[6,1]", "float[6,2]", "", None, 0),
    ("dynamic batch", "float[B,3,8,1]", "float[B,3,5,2]", "onesided=1", None, -2),
    ("double", "double[6,8,2]", "double[6,8,2]", "", None, 1),
]


def dft_model(inp: str, out: str, attrs: str, dft_length: int | None, axis: int) -> onnx.ModelProto:
    length = "" if dft_length is None else f", int64 n = {{{dft_length}}}"
    attributes = f"<{attrs}>" if attrs else ""
    return parse(
        '<ir_version: 10, opset_import: ["" : 20]>\n'
        f"g ({inp} x) => ({out} y) <int64 axis = {{{axis}}}{length}> "
        f"{{ y = DFT{attributes}(x, {'n' if dft_length else ''}, axis) }}"
    )


@pytest.mark.parametrize(("case", "inp", "out", "attrs", "dft_length", "axis"), MODES, ids=[m[0] for m in MODES])
def test_dft_modes_match_onnx_runtime(
    case: str, inp: str, out: str, attrs: str, dft_length: int | None, axis: int
) -> None:
    model = dft_model(inp, out, attrs, dft_length, axis)
    model.graph.node[0].name = "spectrum"
    after, result = apply(DftToMatMul(), model)
    assert result.modified
    moved = case in ("first of two axes", "batch axis 0")
    middle = ["Reshape", "MatMul", "Reshape"]
    assert ops(after) == (["Transpose", *middle, "Transpose"] if moved else middle)
    assert set(created_names(after, "spectrum")) == {n.name for n in after.graph.node}
    dims = [int(d) if d.isdigit() else 6 for d in inp[inp.index("[") + 1 : -1].split(",")]
    x = signals(tuple(dims), "float64" if inp.startswith("double") else "float32")
    scale = np.abs(x).max() * max(dims)  # DFT outputs are sums of up to N inputs
    tolerance = 1e-12 if inp.startswith("double") else 2e-6
    assert_same_outputs(model, after, {"x": x}, rtol=1e-5, atol=tolerance * scale)


def test_opset_17_axis_attribute_and_float16() -> None:
    model = parse(
        '<ir_version: 10, opset_import: ["" : 17]>\n'
        "g (float16[6,16,1] x) => (float16[6,9,2] y) { y = DFT<onesided=1, axis=1>(x) }"
    )
    after, _ = apply(DftToMatMul(), model)
    assert ops(after) == ["Reshape", "MatMul", "Reshape"]
    x = signals((6, 16, 1), "float64")
    x[4] /= 1e4  # stay inside float16's range
    x = x.astype(np.float16)
    assert_same_outputs(model, after, {"x": x}, rtol=1e-2, atol=0.05)


def test_dft_matrix_entries_are_exact_where_they_should_be() -> None:
    plan = dft.DftPlan(axis=0, rank=2, length=4, channels=1, dft_length=4, inverse=False, onesided=False,
                       dtype=np.dtype(np.float32))  # fmt: skip
    w = dft.dft_matrix(plan).reshape(4, 4, 2)
    expected = np.array([[1, 1, 1, 1], [1, -1j, -1, 1j], [1, -1, 1, -1], [1, 1j, -1, -1j]])
    np.testing.assert_array_equal(w[..., 0], expected.real)  # exactly 0 and +-1, not 6e-17
    np.testing.assert_array_equal(w[..., 1], expected.imag)


@pytest.mark.parametrize(
    ("case", "text"),
    [
        ("dynamic signal axis", "g (float[2,L,1] x) => (float[2,L,2] y) <int64 a = {1}> { y = DFT(x, , a) }"),
        ("dft_length an input", "g (float[2,8,1] x, int64 n) => (float[2,M,2] y) <int64 a = {1}> { y = DFT(x, n, a) }"),
        ("axis an input", "g (float[2,8,1] x, int64 a) => (float[2,8,2] y) { y = DFT(x, , a) }"),
        (
            "irfft with other than N/2+1 bins",
            "g (float[2,3,2] x) => (float[2,8,1] y) <int64 n = {8}, int64 a = {1}> "
            "{ y = DFT<inverse=1, onesided=1>(x, n, a) }",
        ),
        ("bfloat16", "g (bfloat16[2,8,2] x) => (bfloat16[2,8,2] y) <int64 a = {1}> { y = DFT(x, , a) }"),
    ],
)
def test_dft_left_unchanged(case: str, text: str) -> None:
    model = onnx.parser.parse_model(f'<ir_version: 10, opset_import: ["" : 20]>\n{text}')
    assert_unchanged(DftToMatMul(), model)
    graph = gs.import_onnx(model)
    assert isinstance(DftToMatMul().check(graph.nodes[0], Facts(graph)), str), case


def test_dft_matrix_size_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    model = dft_model("float[6,8,2]", "float[6,8,2]", "", None, 1)
    monkeypatch.setattr(dft, "MAX_DFT_MATRIX_BYTES", 16 * 16 * 4 - 1)
    assert_unchanged(DftToMatMul(), model)
    monkeypatch.setattr(dft, "MAX_DFT_MATRIX_BYTES", 16 * 16 * 4)
    assert apply(DftToMatMul(), model)[1].modified


class Rfft(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.view_as_real(torch.fft.rfft(x, dim=-1)).abs().sum(-1) + torch.fft.rfft(x, dim=1).real.mean()


class ComplexFft(torch.nn.Module):
    """Complex input written as real with a trailing (real, imaginary) dimension."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.view_as_real(torch.fft.fft(torch.view_as_complex(x), dim=-1, norm="ortho"))


class Irfft(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.fft.irfft(torch.view_as_complex(x), n=14, dim=-1)


@pytest.mark.parametrize(
    ("model", "shape"),
    [(Rfft(), (2, 6, 16)), (ComplexFft(), (3, 8, 2)), (Irfft(), (2, 8, 2))],
    ids=["rfft", "fft", "irfft"],
)
def test_torch_fft_models_convert_without_dft(model: torch.nn.Module, shape: tuple[int, ...]) -> None:
    sample = torch.randn(*shape)
    module = pipeline.convert(model.eval(), sample, backend="onnxruntime")  # validates against PyTorch
    assert "DFT" not in {n.op_type for n in module.onnx.graph.node}
    assert "MatMul" in {n.op_type for n in module.onnx.graph.node}
    assert pipeline.check(module.onnx, trt_version="11.1").ok
    x = torch.randn(*shape)
    torch.testing.assert_close(module(x), model(x), rtol=1e-4, atol=1e-5)
