"""pipeline.compare end to end: a model with one deliberately wrong block, found by the per-layer comparison."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import onnx_graphsurgeon as gs
import pytest
import torch
from torch import nn

import pipeline
from converters.context import ConverterContext
from converters.errors import BuildError, InputError
from converters.registry import ConverterRegistry

# -- a custom op inside blocks.3, and two converters for it: exact, and 1% off ---------------------------------------


@torch.library.custom_op("comparetest::scaled_tanh", mutates_args=())
def scaled_tanh(x: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.tanh(x) * scale


@scaled_tanh.register_fake
def _(x: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.empty_like(x)


def scaled_tanh_registry(error: float) -> ConverterRegistry:
    registry = ConverterRegistry()

    @registry.register("comparetest::scaled_tanh")
    def convert(ctx: ConverterContext) -> gs.Tensor:
        return ctx.op.Mul(ctx.op.Tanh(ctx.input("x")), np.float32(ctx.attrs["scale"] * (1 + error)))

    return registry


class Block(nn.Module):
    def __init__(self, custom: bool) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.act = nn.GELU()
        self.custom = custom

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.lin(x))
        if self.custom:
            h = torch.ops.comparetest.scaled_tanh(h, 1.5)
        return x + h


class Net(nn.Module):
    """Six blocks (blocks.3 holds the custom op when ``planted``), keyword inputs, a dict of two outputs."""

    def __init__(self, planted: bool = True) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(planted and i == 3) for i in range(6)])
        self.norm = nn.LayerNorm(16)
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> dict[str, torch.Tensor]:
        for block in self.blocks:
            x = block(x)
        features = self.norm(x)
        return {"logits": self.head(features) * scale, "features": features}


def sample(seed: int = 0, batch: int = 4) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(batch, 16, generator=generator), "scale": torch.rand(batch, 1, generator=generator) + 1}


def make_net(planted: bool = True) -> Net:
    torch.manual_seed(0)
    return Net(planted).eval()


@pytest.fixture(scope="module")
def planted() -> pipeline.ComparisonReport:
    return pipeline.compare(
        make_net(), sample(), converters=scaled_tanh_registry(0.01), per_layer=True, random_inputs=2
    )


@pytest.fixture(scope="module")
def converted() -> tuple[Net, pipeline.ConvertedModule]:
    model = make_net()
    module = pipeline.convert(
        model, sample(), converters=scaled_tanh_registry(0.01), backend="onnxruntime", validate=False
    )
    return model, module


# -- the planted error ------------------------------------------------------------------------------------------------


def test_per_layer_names_blocks_3_first(planted: pipeline.ComparisonReport) -> None:
    divergence = planted.first_divergence
    assert divergence is not None
    assert divergence.layer.module == "blocks.3"
    modules = [layer.module for layer in planted.layers.layers]  # type: ignore[union-attr]
    before = modules[: modules.index("blocks.3")]
    assert {"blocks.0", "blocks.1", "blocks.2", "blocks.3.lin", "blocks.3.act"} <= set(before)
    assert all(layer.passed for layer in planted.layers.layers[: len(before)])  # type: ignore[union-attr]
    assert (
        modules.index("blocks.2")
        < modules.index("blocks.3.lin")
        < modules.index("blocks.3")
        < modules.index("blocks.4.lin")
    )
    suspects = [name for name, _ in divergence.suspects]
    assert any("scaled_tanh" in name for name in suspects)
    assert not any("linear" in name or "gelu" in name for name in suspects)  # under blocks.3.lin/.act: cleared
    assert {op for _, op in divergence.nodes} >= {"Gemm", "Tanh", "Mul", "Add"}
    assert divergence.layer.stats.outside > 0 and divergence.layer.stats.median_rel < 0.05  # about 1%


def test_outputs_of_a_planted_error_fail_with_statistics(planted: pipeline.ComparisonReport) -> None:
    assert not planted.passed
    assert planted.inputs == 3 and "2 seeded random inputs" in planted.input_source
    by_output = {o.output: o for o in planted.outputs if o.runner == "onnxruntime"}
    assert set(by_output) == {"logits", "features"}
    for comparison in by_output.values():
        s = comparison.stats
        assert not comparison.passed and 0 < s.outside <= s.elements
        assert s.max_abs >= s.p99_abs >= s.median_abs >= 0 and s.max_abs >= s.mean_abs
        assert s.max_rel >= s.p99_rel and 0.99 < s.cosine <= 1.0
        assert (comparison.atol, comparison.rtol) == (1e-5, 1e-4)  # DEFAULT_TOLERANCES["float32"]
        assert sum(s.histogram) == s.elements
    assert "atol" in planted.rule and "rtol * |ref|" in planted.rule


def test_runners_that_cannot_run_are_named_with_the_reason(planted: pipeline.ComparisonReport) -> None:
    runners = {r.name: r for r in planted.runners}
    assert runners["torch"].skipped is None and runners["onnxruntime"].skipped is None
    assert "comparetest::scaled_tanh" in (runners["onnxruntime-exported"].skipped or "")
    assert runners["tensorrt"].skipped  # no TensorRT on this machine: left out, with why


def test_exact_converter_passes_with_no_divergence() -> None:
    report = pipeline.compare(
        make_net(), sample(), converters=scaled_tanh_registry(0.0), per_layer=True, random_inputs=1
    )
    assert report.passed and report.first_divergence is None
    assert report.layers is not None and all(layer.passed for layer in report.layers.layers)


# -- inputs: dict samples, a user iterable, a generator; the exported-graph runner; float64 reference --------------


def test_user_iterable_of_dict_samples_and_the_exported_graph() -> None:
    samples = [sample(seed) for seed in range(3)]
    report = pipeline.compare(make_net(planted=False), samples, reference_dtype="float64")
    assert report.inputs == 3 and report.input_source == "3 given samples"
    names = {r.name: r for r in report.runners}
    assert names["onnxruntime-exported"].skipped is None  # no custom op: the exported graph runs too
    assert report.reference == "torch-float64" and names["torch"].skipped is None
    runners = {o.runner for o in report.outputs}
    assert runners == {"torch", "onnxruntime-exported", "onnxruntime"}
    assert report.passed, report.table()


def test_generator_of_samples_with_random_inputs(converted: tuple[Net, pipeline.ConvertedModule]) -> None:
    model, module = converted

    def samples() -> Iterator[dict[str, torch.Tensor]]:
        yield sample(5, batch=4)
        yield sample(6, batch=4)

    report = pipeline.compare(model, samples(), random_inputs=1, backends=["onnxruntime"], module=module)
    assert report.inputs == 3 and report.input_source.startswith("2 given samples and 1 seeded")


# -- ConvertedModule.compare and the memory budget -------------------------------------------------------------------


def test_converted_module_compare_names_blocks_3(converted: tuple[Net, pipeline.ConvertedModule]) -> None:
    model, module = converted
    report = pipeline.compare(model, sample(1), per_layer=True, random_inputs=1, module=module)
    assert report.first_divergence is not None and report.first_divergence.layer.module == "blocks.3"
    skipped = {r.name: r.skipped for r in report.runners}
    assert "does not keep the exported graph" in (skipped["onnxruntime-exported"] or "")


def test_small_memory_budget_observes_in_chunks_with_the_same_result(
    converted: tuple[Net, pipeline.ConvertedModule],
) -> None:
    model, module = converted
    whole = pipeline.compare(model, sample(2), per_layer=True, random_inputs=0, module=module)
    chunked = pipeline.compare(model, sample(2), per_layer=True, random_inputs=0, memory_budget=600, module=module)
    assert whole.layers is not None and chunked.layers is not None
    assert whole.layers.chunks == 1 and chunked.layers.chunks >= 5
    assert [(x.module, x.stats.max_abs) for x in whole.layers.layers] == [
        (x.module, x.stats.max_abs) for x in chunked.layers.layers
    ]
    assert chunked.first_divergence is not None and chunked.first_divergence.layer.module == "blocks.3"


def test_tolerance_by_module_path_moves_the_first_divergence(
    converted: tuple[Net, pipeline.ConvertedModule],
) -> None:
    model, module = converted
    report = pipeline.compare(
        model, sample(3), per_layer=True, random_inputs=0, tolerances={"blocks.3": (1.0, 1.0)}, module=module
    )
    assert report.first_divergence is not None and report.first_divergence.layer.module == "blocks.4.lin"


# -- errors -----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "error", "text"),
    [
        ({"backends": ["tensorrt"]}, BuildError, "TensorRT cannot run here"),
        ({"backends": ["onnx"]}, InputError, "unknown comparison backend"),
        ({"reference_dtype": "float16"}, InputError, "unknown reference_dtype"),
        ({"random_inputs": -1}, InputError, "random_inputs"),
    ],
)
def test_bad_options_are_clear_errors(
    converted: tuple[Net, pipeline.ConvertedModule], options: dict[str, Any], error: type[Exception], text: str
) -> None:
    model, module = converted
    with pytest.raises(error, match=text):
        pipeline.compare(model, sample(), **options, module=module)


def test_empty_iterable_is_an_input_error(converted: tuple[Net, pipeline.ConvertedModule]) -> None:
    model, module = converted
    with pytest.raises(InputError, match="empty"):
        pipeline.compare(model, [], module=module)
