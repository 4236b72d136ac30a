"""Outputs that are uninitialised memory (empty tensors reaching an output directly or through views) are found in
the exported program and judged by shape and dtype only, with the reason in the report; everything computed from
them otherwise, or written before it is returned, is still compared value by value."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

import pipeline
from pipeline.accuracy.uninitialised import ShapeAccumulator, uninitialised_outputs


class _Empties(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        viewed = x.new_empty((2, 3)).t()  # through a view
        strided = torch.empty_strided((2, 2), (1, 2))
        copied = torch.empty_like(x).transpose(0, 1).contiguous()  # a view, then a value-preserving copy
        filled = torch.empty(3).fill_(2.0)  # written: a real value
        computed = torch.empty(2, 2) * 0.0 + x[:2, :2]  # computed from it: compared value by value
        return viewed, x + 1, strided, copied, filled, computed


def test_uninitialised_outputs_are_found_in_the_program_and_judged_by_shape() -> None:
    module = pipeline.convert(_Empties().eval(), torch.randn(3, 2), backend="onnxruntime", validate=False)
    found = uninitialised_outputs(module.onnx)  # recorded at export, kept through the passes
    assert sorted(found) == ["out_0", "out_2", "out_3"]
    assert found["out_0"] == "aten.new_empty.default 'new_empty'"
    assert found["out_2"].startswith("aten.empty_strided") and found["out_3"].startswith("aten.empty_like")


class _NewEmpty(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.new_empty((4, 5)).t(), x * 2


def test_an_uninitialised_output_passes_with_its_reason_in_the_report() -> None:
    """Before: its values (whatever PyTorch's memory held) were compared with the graph's zeros, an AccuracyError
    at random. Now: judged by shape and dtype, said so in the report; the other output is compared as usual."""
    module = pipeline.convert(_NewEmpty().eval(), torch.randn(3, 2), backend="onnxruntime")
    accuracy = module.report.accuracy
    assert accuracy is not None and accuracy.passed
    empty, doubled = accuracy.outputs
    assert empty.note.startswith("uninitialised memory (from aten.new_empty.default")
    assert "judged by shape and dtype only" in empty.summary() and empty.elements == 4 * 20
    assert doubled.note == "" and doubled.max_abs == 0.0
    assert "uninitialised memory" in accuracy.rule
    assert "uninitialised memory" in module.report.summary()
    assert module(torch.randn(3, 2))[0].shape == (5, 4)


def test_a_shape_or_kind_mismatch_fails_the_shape_rule() -> None:
    acc = ShapeAccumulator("aten.empty.memory_format 'empty'")
    acc.add(np.zeros((2, 3), np.float32), np.full((2, 3), np.nan, np.float32))
    assert acc.result().passed
    acc.add(np.zeros((3, 2), np.float32), np.zeros((2, 3), np.float32))
    result = acc.result()
    assert not result.passed and result.outside == 12 and "shape [3, 2] against the reference's [2, 3]" in result.note
    kinds = ShapeAccumulator("aten.empty.memory_format 'empty'")
    kinds.add(np.zeros(2, np.int64), np.zeros(2, np.float32))
    assert "integer values against the reference's float values" in kinds.result().note
