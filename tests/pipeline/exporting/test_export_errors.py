"""Export-stage failures that cannot be converted say so clearly: the stage, the op, and a fix (never a raw
exception): complex tensors, Python values computed from tensor data, data-dependent control flow."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import pipeline


class Op(nn.Module):
    """forward(*tensors) = fn(*tensors)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *tensors: torch.Tensor) -> Any:
        return self.fn(*tensors)


def _convert_error(fn: Callable[..., Any], *sample: torch.Tensor) -> pipeline.PipelineError:
    with pytest.raises(pipeline.PipelineError) as info:
        pipeline.convert(Op(fn), sample, backend="onnxruntime")
    text = str(info.value)
    assert "fix:" in text, text
    return info.value


@pytest.mark.parametrize(
    ("fn", "op"),
    [
        (lambda x: torch.view_as_complex(x), "aten.view_as_complex"),
        (lambda x: torch.complex(x[..., 0], x[..., 1]) * 2, "aten.complex"),
    ],
    ids=["view_as_complex", "complex"],
)
def test_complex_outputs_name_the_op_that_makes_them(fn: Callable[..., Any], op: str) -> None:
    error = _convert_error(fn, torch.randn(3, 4, 2))
    assert isinstance(error, pipeline.ExportError)
    assert error.node is not None and error.node.startswith(op)
    assert "complex" in error.message and "view_as_real" in str(error.fix)


def test_a_complex_output_of_real_math_still_converts_when_returned_as_real() -> None:
    model = Op(lambda x: torch.view_as_real(torch.view_as_complex(x) * (1 + 2j)))
    module = pipeline.convert(model, torch.randn(3, 4, 2), backend="onnxruntime")
    x = torch.randn(3, 4, 2)
    torch.testing.assert_close(module(x), model(x))


def test_complex_inputs_are_an_input_error() -> None:
    error = _convert_error(lambda z: z.abs(), torch.randn(3, 4, dtype=torch.complex64))
    assert isinstance(error, pipeline.InputError) and "complex64" in error.message


@pytest.mark.parametrize(
    ("fn", "op", "kind"),
    [
        (lambda a, b: torch.equal(a, b), "aten.equal", "bool"),
        (lambda a, b: torch.allclose(a, b), "aten.allclose", "bool"),
        (lambda a, b: (a * b).sum().item(), "aten._local_scalar_dense", "float"),
    ],
    ids=["equal", "allclose", "item"],
)
def test_python_value_outputs_name_the_op(fn: Callable[..., Any], op: str, kind: str) -> None:
    error = _convert_error(fn, torch.randn(3), torch.randn(3))
    assert isinstance(error, pipeline.ExportError) and f"is a {kind}" in error.message
    assert error.node is not None and error.node.startswith(op)


class ReturnsItsSizes(torch.nn.Module):
    """MaskFormer-Swin's way: Python numbers of the call's shapes beside the tensors (its spatial dimensions)."""

    def forward(self, x: torch.Tensor) -> dict[str, Any]:
        return {"features": x * 2, "sizes": (x.shape[0], x.shape[1]), "name": "stage1"}


def test_python_numbers_of_the_shapes_come_back_as_the_sample_gave_them(tmp_path: Path) -> None:
    x = torch.randn(2, 3)
    module = pipeline.convert(ReturnsItsSizes(), x, backend="onnxruntime")
    out = pipeline.load(module.save(tmp_path / "sizes")).forward(x)
    assert out["sizes"] == (2, 3) and out["name"] == "stage1" and torch.allclose(out["features"], x * 2)
    assert [o.name for o in module.onnx.graph.output] == ["features"]
    with pytest.raises(pipeline.ExportError, match="only tensors"):  # with dynamic shapes they would vary
        pipeline.convert(ReturnsItsSizes(), x, backend="onnxruntime", dynamic={"x": {0: ("batch", 1, 2, 4)}})


def test_data_dependent_values_inside_the_model_name_the_op() -> None:
    def fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a + 1 if torch.equal(a, b) else a - 1

    error = _convert_error(fn, torch.randn(3), torch.randn(3))
    assert isinstance(error, pipeline.ExportError) and "data" in error.message
    assert error.node is not None and "equal" in error.node


_LIBRARY = torch.library.Library("export_errors_test", "DEF")
_LIBRARY.define("scale_dims(Tensor x, int[] dims=[1]) -> Tensor")


@torch.library.impl(_LIBRARY, "scale_dims", "CompositeExplicitAutograd")
def _scale_dims(x: torch.Tensor, dims: list[int]) -> torch.Tensor:
    return x * (len(dims) + 1)


@torch.library.register_fake("export_errors_test::scale_dims")
def _scale_dims_fake(x: torch.Tensor, dims: list[int]) -> torch.Tensor:
    return torch.empty_like(x)


def test_an_attribute_the_graph_cannot_hold_names_the_node() -> None:
    # dims=[] differs from the schema default [1]: an empty list attribute has no type to be written with
    error = _convert_error(lambda x: torch.ops.export_errors_test.scale_dims(x, []), torch.randn(3))
    assert isinstance(error, pipeline.ExportError)
    assert error.node is not None and "scale_dims" in error.node


class MaskedEagerly(nn.Module):
    """Fills in its mask only when it runs eagerly (as transformers' LongT5 and Switch Transformers do)."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        if mask is None and not torch.compiler.is_compiling():
            mask = torch.ones_like(x)
        return x * mask[:, :1]  # type: ignore[index]


def test_a_none_the_model_fills_only_eagerly_names_its_line_and_the_input_to_pass() -> None:
    model, x = MaskedEagerly(), torch.randn(2, 3)
    assert model(x).shape == (2, 3)  # eager PyTorch runs it
    with pytest.raises(pipeline.ExportError) as info:
        pipeline.convert(model, x, backend="onnxruntime")
    text = str(info.value)
    assert "'NoneType' object is not subscriptable" in text and "None under torch.export" in text, text
    assert "test_export_errors.py:" in text and "in forward" in text, text  # the model's own line
    assert "pass that input explicitly" in text and "attention_mask" in text, text
    module = pipeline.convert(model, (x, torch.ones_like(x)), backend="onnxruntime")  # and the fix works
    assert torch.equal(module(x, torch.ones_like(x)), x)


class CastsItsLayer(nn.Module):
    """Converts a submodule inside forward() (as transformers' Switch Transformers router does, to float32)."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.layer, self.dtype = nn.Linear(3, 3), dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.layer = self.layer.to(self.dtype)
        return self.layer(x.to(self.dtype)).float()


def test_a_module_converting_its_own_weights_to_what_they_are_converts() -> None:
    """``.to(float32)`` of float32 weights inside forward() changes nothing eagerly, and exports as nothing."""
    torch.manual_seed(0)
    original_to = nn.Module.__dict__["to"]
    model, x = CastsItsLayer(torch.float32), torch.randn(2, 3)
    module = pipeline.convert(model, x, backend="onnxruntime")
    assert module.report.accuracy is not None and module.report.accuracy.passed
    assert torch.allclose(module(x), model(x), atol=1e-6)
    assert nn.Module.__dict__["to"] is original_to  # the patch is removed after the export


class MaskSkippedEagerly(torch.nn.Module):
    """transformers' way: an all-ones mask is dropped when running eagerly, kept under torch.export; this one is built
    for another length than the keys, which only the export meets."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = torch.ones(1, 1, x.shape[2], x.shape[2] * 2, dtype=torch.bool)
        if not torch.compiler.is_exporting() and bool(mask.all()):
            mask = None
        return torch.nn.functional.scaled_dot_product_attention(x, x, x, attn_mask=mask)


def test_an_attention_mask_that_does_not_fit_its_keys_is_named_with_its_fix() -> None:
    with pytest.raises(pipeline.ExportError) as caught:
        pipeline.convert(MaskSkippedEagerly(), torch.randn(1, 2, 4, 8))
    assert "Attempting to broadcast" in str(caught.value)
    assert "mask length differs from its keys'" in caught.value.fix
    assert "usual fixes" not in caught.value.fix


class AddSkippedEagerly(torch.nn.Module):
    """Shapes that meet only eagerly: the addition is skipped when its tensor is all zeros, except under export."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = torch.zeros(x.shape[0], x.shape[1] * 2)
        if not torch.compiler.is_exporting() and not bool(bias.any()):
            return x
        return x + bias


def test_shapes_that_meet_only_eagerly_name_the_models_line() -> None:
    with pytest.raises(pipeline.ExportError) as caught:
        pipeline.convert(AddSkippedEagerly(), torch.randn(2, 3))
    assert "disagree only under torch.export" in caught.value.fix
    assert "test_export_errors.py" in str(caught.value.node) and "in forward" in str(caught.value.node)


class MaskDroppedUnlessPadded(torch.nn.Module):
    """Nystromformer's way: a mask built [L, L] against scores [L/2, L]; all ones, it is dropped eagerly, so only an
    unpadded input ever runs, and a padded one fails in PyTorch as the export does."""

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        scores = x[:, : x.shape[1] // 2, None] * x[:, None, :]  # [B, L/2, L]
        if not torch.compiler.is_exporting() and bool(attention_mask.all()):
            return scores
        mask = (1.0 - attention_mask[:, None, :].float()) * attention_mask[:, :, None].float()  # [B, L, L]
        return scores + mask


def test_a_model_that_fails_in_pytorch_once_padded_is_said_so() -> None:
    with pytest.raises(pipeline.ExportError) as caught:
        pipeline.convert(MaskDroppedUnlessPadded(), {"x": torch.randn(1, 8), "attention_mask": torch.ones(1, 8)})
    assert "fails in PyTorch too once its attention mask pads anything: RuntimeError" in str(caught.value)
    assert "report it to the model's authors" in caught.value.fix and "usual fixes" not in caught.value.fix
    assert "test_export_errors.py" in str(caught.value.node)


def test_an_assertion_inside_pytorchs_decomposition_names_the_line_and_fixed_sizes() -> None:
    """ViLT's patch sampling (per-row lists of nonzero() indices over unique() rows) trips an assertion inside
    PyTorch's prims while torch.export traces it: the error names the model's line and what to compute instead,
    not only the generic list."""
    import tests_environment  # noqa: F401 -- torchvision's operator schemas, before transformers' models
    from model_sources.transformers_all_models import build

    model, (_, kwargs) = build("vilt", "ViltModel")
    with pytest.raises(pipeline.ExportError) as caught:
        pipeline.convert(model, kwargs)
    text = str(caught.value)
    assert "modeling_vilt.py:" in text and "PyTorch's own decomposition" in text and "nonzero()" in text
    assert "usual fixes" not in text
