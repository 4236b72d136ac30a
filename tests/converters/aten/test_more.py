"""The converters of ``converters/aten/more.py``, ``aten_histogram.py`` and ``aten_losses.py``: every declared case
against PyTorch on ONNX Runtime and built by the real TensorRT-RTX builder; the OpInfo sample of each op through the
coverage harness; rrelu's random slopes judged by their range and distribution; and what the validators decline."""

from __future__ import annotations

import onnx
import opinfo_support as support
import pytest
import torch
from converter_cases import assert_case_lowers_matches_and_builds, own_cases
from rtx_build import assert_builds

import pipeline
from converters.aten.more import register_more_converters
from converters.cases import ConverterCase
from converters.registry import ConverterEntry

OWN, REGISTRY, CASES = own_cases(register_more_converters)


@pytest.mark.parametrize(("entry", "case"), CASES, ids=[c.name for _, c in CASES])
def test_case_matches_pytorch_and_builds(entry: ConverterEntry, case: ConverterCase) -> None:
    assert_case_lowers_matches_and_builds(entry, case, REGISTRY, OWN, custom_domains_only=True)


_OPS = [
    "nn.functional.pdist",
    "put",
    "_segment_reduce.lengths",
    "_segment_reduce.offsets",
    "nn.functional.rrelu",
    "resize_as_",
    "histogram",
    "histogramdd",
    "grid_sampler_3d",
    "nn.functional.linear_cross_entropy",
    "nn.functional.linear_cross_entropy.chunked",
    "nn.functional.linear_cross_entropy.chunked_none",
]


@pytest.mark.parametrize("name", _OPS)
def test_opinfo_sample_converts_matches_and_builds(name: str) -> None:
    op = support.all_ops()[name]
    samples, why = support.usable_samples(op)
    assert samples, why
    outcome = support.run_ours(op, samples[0])
    assert outcome.status == "ok", outcome.reason


class _RreluTraining(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.rrelu(x, 0.1, 0.4, training=True)


def test_rrelu_training_draws_slopes_in_range_and_validates_by_distribution() -> None:
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(0))
    module = pipeline.convert(_RreluTraining(), (x,), converters=REGISTRY)
    assert "RandomUniformLike" in {n.op_type for n in module.onnx.graph.node}
    accuracy = module.report.accuracy
    assert accuracy is not None and accuracy.outputs[0].passed and accuracy.outputs[0].note.startswith("random")
    out = module(x)
    negative = x < 0
    assert torch.equal(out[~negative], x[~negative])
    slopes = out[negative] / x[negative]
    assert bool(((slopes >= 0.1 - 1e-6) & (slopes <= 0.4 + 1e-6)).all())
    assert 0.2 < float(slopes.mean()) < 0.3 and float(slopes.std()) > 0.05  # U(0.1, 0.4): mean 0.25, std 0.087
    assert_builds(module)


@pytest.mark.parametrize(("name", "segments"), [("lengths", [0, 3, 0, 2]), ("offsets", [0, 0, 3, 3, 5])])
def test_segment_reduce_sample_matches_pytorch_and_builds(name: str, segments: list[int]) -> None:
    # the OpInfo sample's lengths/offsets are graph inputs: the converted graph must take another segmentation
    op = support.all_ops()[f"_segment_reduce.{name}"]
    samples, why = support.usable_samples(op)
    assert samples, why
    model = support.Wrap(op, samples[0]).eval()
    module = pipeline.convert(model, model.tensors, converters=REGISTRY)
    data = torch.randn(5)
    torch.testing.assert_close(module(data, torch.tensor(segments)), model(data, torch.tensor(segments)))
    assert_builds(module)


def test_segment_mean_of_an_empty_segment_is_nan_as_in_pytorch() -> None:
    model = _EmptySegmentMean()
    data = torch.randn(5, 2, generator=torch.Generator().manual_seed(0))
    module = pipeline.convert(model, (data,), converters=REGISTRY)
    got, expected = module(data), model(data)
    assert bool(got[1].isnan().all()) and bool(expected[1].isnan().all())
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5, equal_nan=True)
    assert_builds(module)


class _EmptySegmentMean(torch.nn.Module):
    def forward(self, data: torch.Tensor) -> torch.Tensor:
        return torch.segment_reduce(data, "mean", lengths=torch.tensor([2, 0, 3]))


class _Grow(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.clone().resize_(4, 4)


def test_resize_to_more_elements_is_declined_with_the_op_named() -> None:
    with pytest.raises(pipeline.ConversionError, match="resize"):
        pipeline.convert(_Grow(), (torch.randn(3, 3),), converters=REGISTRY, validate=False)


def test_unbatched_cross_entropy_graph_is_valid_onnx() -> None:
    op = support.all_ops()["nn.functional.linear_cross_entropy"]
    samples, _ = support.usable_samples(op)
    model = support.Wrap(op, samples[0]).eval()
    module = pipeline.convert(model, model.tensors, converters=REGISTRY)
    onnx.checker.check_model(module.onnx, full_check=True)
