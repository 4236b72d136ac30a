"""``embedding_bag`` without sequence ops (converters/aten/embedding.py): offsets as data
(inputs of the graph, so the membership of each index in each bag is computed at run time, empty bags included),
every mode with padding_idx and per-sample weights, against PyTorch on ONNX Runtime and built by the real
TensorRT-RTX builder; the bookkeeping outputs refused when read; OpInfo's own samples."""

from __future__ import annotations

import warnings

import pytest
import torch
from rtx_build import assert_builds

import pipeline
from converters.aten.embedding import _EmbeddingBag
from converters.errors import ConversionError

SEQUENCE_OPS = {"SequenceEmpty", "SequenceInsert", "ConcatFromSequence", "Loop"}

INDICES = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9, 0])
OFFSETS = torch.tensor([0, 4, 4, 6])  # bag 1 is empty


@pytest.mark.parametrize(
    "options",
    [
        {"mode": "mean", "include_last_offset": True},
        {"mode": "mean", "padding_idx": 2},
        {"mode": "max", "padding_idx": 4},
        {"mode": "sum", "per_sample_weights": True},
    ],
    ids=["mean-last-offset", "mean-padding", "max-padding", "sum-weights"],
)
def test_offsets_as_inputs_match_pytorch_and_build(options: dict[str, object]) -> None:
    """Offsets are graph inputs here: validation draws other offsets (starting at 0, sorted), so the bags'
    boundaries move between inputs and nothing about them can be folded. With include_last_offset the last
    offset (6) is not the number of indices (9): PyTorch's mean then divides the sum up to it by the count to the
    end, and so does the converter."""
    weighted = bool(options.pop("per_sample_weights", False))
    model = _EmbeddingBag(**options).eval()  # type: ignore[arg-type]
    sample = (INDICES, OFFSETS, *([torch.linspace(-1.5, 2.0, INDICES.numel())] if weighted else []))
    module = pipeline.convert(model, sample, backend="onnxruntime", validation_inputs=4)
    assert not {n.op_type for n in module.onnx.graph.node} & SEQUENCE_OPS
    accuracy = module.report.accuracy
    assert accuracy is not None and accuracy.passed and accuracy.inputs == 5
    with torch.no_grad():
        expected = model(*sample)
        torch.testing.assert_close(module(*sample), expected, rtol=1e-4, atol=1e-5)
    assert bool((expected[1] == 0).all())  # the empty bag is zeros, in every mode
    assert_builds(module)


class _AllOutputs(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(10, 3))

    def forward(self, indices: torch.Tensor, offsets: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(torch.ops.aten._embedding_bag(self.weight, indices, offsets, mode=1))


def test_reading_the_bookkeeping_outputs_is_a_clear_conversion_error() -> None:
    with pytest.raises(ConversionError, match=r"outputs \[1, 2, 3\] .* are used") as info:
        pipeline.convert(_AllOutputs().eval(), (INDICES, OFFSETS), backend="onnxruntime", validate=False)
    assert "fix:" in str(info.value)


def test_opinfo_samples_convert_without_sequence_ops() -> None:
    """PyTorch's own OpInfo samples of nn.functional.embedding_bag: 2-D indices (bags of equal length) with a
    padding_idx and per-sample weights; mean with include_last_offset. (The first sample is in the coverage
    table; the declared cases run in test_builtin_cases.py.)"""
    from opinfo_support import Wrap
    from torch.testing._internal.common_methods_invocations import op_db

    op = next(o for o in op_db if o.name == "nn.functional.embedding_bag")
    samples = list(op.sample_inputs("cpu", torch.float32, requires_grad=False))
    for sample in (samples[6], samples[33]):
        assert sample.kwargs.get("padding_idx") == 2 or sample.kwargs.get("include_last_offset")
        model = Wrap(op, sample).eval()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            module = pipeline.convert(model, model.tensors, backend="onnxruntime", validation_inputs=1)
        assert not {n.op_type for n in module.onnx.graph.node} & SEQUENCE_OPS
        with torch.no_grad():
            torch.testing.assert_close(module(*model.tensors), model(*model.tensors), rtol=1e-4, atol=1e-5)


def test_dynamic_numbers_of_indices_and_bags_match_pytorch_and_build() -> None:
    model = _EmbeddingBag(mode="mean", padding_idx=2).eval()
    dynamic = {"indices": {0: ("n", 6, 9, 16)}, "more": {0: ("bags", 1, 4, 5)}}  # ``more``: forward's *more
    module = pipeline.convert(model, (INDICES, OFFSETS), backend="onnxruntime", dynamic=dynamic)
    indices, offsets = torch.randint(0, 10, (14,), generator=torch.Generator().manual_seed(1)), torch.tensor([0, 3, 10])
    with torch.no_grad():
        torch.testing.assert_close(module(indices, offsets), model(indices, offsets), rtol=1e-4, atol=1e-5)
    assert_builds(module)
