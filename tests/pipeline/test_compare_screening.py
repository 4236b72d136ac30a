"""pipeline.compare as validation does it: drawn inputs PyTorch itself refuses are dropped loudly (a WARNING, the
report's ``dropped`` in JSON, Markdown and the table) and the comparison goes on with the others; a given sample
refused stays an InputError; outputs that are uninitialised memory are judged by shape and dtype, not by value."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from refusing_models import TARGET, LowerCholesky, ShiftedCrossEntropy, X
from torch import nn

import pipeline
from converters.errors import InputError

_BACKENDS = ("onnxruntime-exported", "onnxruntime")


def test_refused_draws_are_dropped_loudly_and_the_rest_compared(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: the first refused draw was an InputError and nothing was compared."""
    with caplog.at_level(logging.WARNING, logger="pipeline"):
        report = pipeline.compare(
            ShiftedCrossEntropy().eval(), (X, TARGET), backends="onnxruntime", reference_dtype="float64",
            random_inputs=6, seed=2, output_dir=tmp_path,
        )  # fmt: skip
    assert report.passed and report.inputs == 4  # 7 inputs, 3 dropped (the draws validation drops too)
    assert [d.index for d in report.dropped] == [1, 4, 6]
    assert all(d.function == "binary_cross_entropy" and "between 0 and 1" in d.reason for d in report.dropped)
    assert len(report.feeds) == len(report.reference_outputs) == 4  # the reproducer's files leave them out too
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "dropped" in r.getMessage()]
    assert len(warnings) == 3 and "'binary_cross_entropy'" in warnings[0].getMessage()
    data = json.loads((tmp_path / "report.json").read_text())
    assert [d["index"] for d in data["dropped"]] == [1, 4, 6] and data["inputs"]["count"] == 4
    assert "3 drawn input(s) dropped" in data["inputs"]["source"]
    markdown = (tmp_path / "report.md").read_text()
    assert "**Dropped**: 3 drawn input(s) PyTorch itself refused" in markdown
    assert "input 4 dropped: PyTorch raised in torch function 'binary_cross_entropy'" in markdown
    assert "dropped     input 1 dropped" in report.table()


def test_a_refusal_outside_python_names_the_aten_op_and_the_sample_alone_is_compared() -> None:
    a = torch.tensor([[4.0, 9.0, -3.0], [1.0, 5.0, 7.0], [0.5, 1.0, 6.0]])  # lower triangle: positive definite
    report = pipeline.compare(LowerCholesky().eval(), a, backends="onnxruntime", random_inputs=2)
    assert report.passed and report.inputs == 1 and [d.index for d in report.dropped] == [1, 2]
    assert all(d.function.startswith("aten.") and "positive-definite" in d.reason for d in report.dropped)


def test_a_given_sample_refused_is_an_input_error_not_dropped() -> None:
    refused = (torch.tensor([3.0, 0.0, 0.0, 0.0]), TARGET)
    with pytest.raises(InputError, match="PyTorch itself raised in torch function 'binary_cross_entropy'") as info:
        pipeline.compare(ShiftedCrossEntropy().eval(), [(X, TARGET), refused], backends="onnxruntime")
    assert "fix:" in str(info.value)


class _NewEmpty(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.new_empty((4, 5)).t(), x * 2


def test_an_uninitialised_output_is_judged_by_shape_with_its_reason_in_the_report(tmp_path: Path) -> None:
    """Before: PyTorch's uninitialised memory was compared with the graph's zeros, a FAIL at random."""
    report = pipeline.compare(_NewEmpty().eval(), torch.randn(3, 2), backends=_BACKENDS, output_dir=tmp_path)
    assert report.passed and report.inputs == 4 and report.dropped == ()
    assert "uninitialised memory" in report.rule
    by_output = {(o.runner, o.output): o for o in report.outputs}
    for runner in _BACKENDS:
        empty, doubled = by_output[(runner, "out_0")], by_output[(runner, "out_1")]
        assert empty.note.startswith("uninitialised memory (from aten.new_empty.default")
        assert empty.to_dict()["judged_by"] == "shape" and empty.to_dict()["elements"] == 4 * 20
        assert doubled.to_dict()["judged_by"] == "elementwise" and doubled.to_dict()["max_abs"] == 0.0
    markdown = (tmp_path / "report.md").read_text()
    assert "ok (uninitialised: by shape and dtype)" in markdown
    assert "Polygraphy compares `out_0` by value too" in markdown
    assert "ok (uninitialised: by shape and dtype)" in report.table()
