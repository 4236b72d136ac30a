"""The ATen converters of ``converters/aten/tensor.py``, ``aten_linalg.py``, ``aten_lu.py`` and ``aten_qr.py``:
every declared case against PyTorch on ONNX Runtime and built by the real TensorRT-RTX builder; PyTorch's own
OpInfo samples; singular inputs; and the clear error for what the validators decline."""

from __future__ import annotations

import pytest
import torch
from converter_cases import assert_case_lowers_matches_and_builds, own_cases
from rtx_build import assert_builds
from torch.utils import _pytree as pytree

import pipeline
from converters.aten.tensor import register_aten2_converters
from converters.cases import ConverterCase
from converters.registry import ConverterEntry

OWN, REGISTRY, CASES = own_cases(register_aten2_converters)


@pytest.mark.parametrize(("entry", "case"), CASES, ids=[c.name for _, c in CASES])
def test_case_matches_pytorch_and_builds(entry: ConverterEntry, case: ConverterCase) -> None:
    assert_case_lowers_matches_and_builds(entry, case, REGISTRY, OWN)


class _Plain(torch.nn.Module):
    """An OpInfo sample as a module whose inputs are the sample's tensors (the other arguments are constants)."""

    def __init__(self, function: object, sample: object) -> None:
        super().__init__()
        self.function = function
        leaves, self.spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))  # type: ignore[attr-defined]
        self.is_tensor = [isinstance(x, torch.Tensor) for x in leaves]
        self.constants = [None if t else x for x, t in zip(leaves, self.is_tensor, strict=True)]
        self.tensors = tuple(x for x, t in zip(leaves, self.is_tensor, strict=True) if t)

    def forward(self, *tensors: torch.Tensor) -> object:
        given = iter(tensors)
        leaves = [next(given) if t else c for t, c in zip(self.is_tensor, self.constants, strict=True)]
        first, args, kwargs = pytree.tree_unflatten(leaves, self.spec)
        result = self.function(first, *args, **kwargs)  # type: ignore[operator]
        return tuple(result) if isinstance(result, tuple) else result


_OPINFO = [
    "linalg.det",
    "linalg.inv",
    "linalg.solve",
    "linalg.lu_solve",
    "linalg.solve_triangular",
    "logdet",
    "cholesky_solve",
    "cholesky_inverse",
    "index_reduce.amax",
    "index_reduce.mean",
    "isin",
    "linalg.lu_factor",
    "linalg.tensorinv",
    "linalg.qr",
    "linalg.householder_product",
    "ormqr",
    "as_strided_scatter",
    "nn.functional.adaptive_max_pool2d",
    "kthvalue",
]


def _opinfo_samples(name: str, count: int) -> list[tuple[_Plain, tuple[torch.Tensor, ...]]]:
    from opinfo_support import all_ops

    op = all_ops()[name]
    found = []
    for sample in op.sample_inputs("cpu", torch.float32, requires_grad=False):
        module = _Plain(op.op, sample)
        if (
            not module.tensors
            or any(t.numel() == 0 for t in module.tensors)
            or any(t.dim() == 0 for t in module.tensors)
        ):
            continue  # empty and 0-d samples: the OpInfo suite's and validation's cases, not these converters
        found.append((module, module.tensors))
        if len(found) == count:
            break
    return found


@pytest.mark.parametrize("name", _OPINFO)
def test_opinfo_samples_match_and_build(name: str) -> None:
    samples = _opinfo_samples(name, 2)
    assert samples, f"no usable float32 sample for {name}"
    for module, tensors in samples:
        converted = pipeline.convert(module.eval(), tensors, converters=REGISTRY)
        assert_builds(converted)


class _Det(torch.nn.Module):
    def forward(self, a: torch.Tensor) -> tuple[torch.Tensor, ...]:
        inverse, info = torch.linalg.inv_ex(a)
        return torch.linalg.det(a), info


def test_singular_matrix_gives_zero_det_and_lapack_info() -> None:
    regular = torch.tensor([[2.0, 1.0, 0.0], [1.0, 3.0, 1.0], [0.0, 1.0, 4.0]])
    module = pipeline.convert(_Det(), (regular,), converters=REGISTRY)
    singular = torch.tensor([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [1.0, 0.0, 1.0]])
    det, info = module(singular)
    expected_det, expected_info = _Det()(singular)
    assert abs(float(det)) < 1e-6 and float(expected_det) == 0.0
    assert int(info) == int(expected_info) == 3


class _Cholesky(torch.nn.Module):
    def forward(self, a: torch.Tensor) -> torch.Tensor:
        return torch.linalg.cholesky(a @ a.mT + torch.eye(a.shape[-1]))


def test_a_dynamic_matrix_side_is_declined_with_the_op_named() -> None:
    with pytest.raises(pipeline.ConversionError, match="linalg_cholesky"):
        pipeline.convert(
            _Cholesky(),
            (torch.randn(4, 4),),
            converters=REGISTRY,
            dynamic={"a": {0: ("n", 2, 4, 8), 1: ("n", 2, 4, 8)}},
        )
