"""Random outputs: found from the graph's random nodes (through edges, functions and subgraphs) and judged by a
two-sample Kolmogorov-Smirnov test whose bound follows the number of values; and pipeline.compare on them."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
import pytest
import torch
from onnx import helper
from torch import nn

import pipeline
from pipeline.accuracy.distribution import (
    YARDSTICK_DRAWS,
    DistributionAccumulator,
    ks_distance,
    measure_torch_spread,
    random_outputs,
    random_tensors,
)


def _graph(
    nodes: list[onnx.NodeProto], outputs: list[str], functions: Sequence[onnx.FunctionProto] = ()
) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4])
    outs = [helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, [4]) for name in outputs]
    graph = helper.make_graph(nodes, "g", [x], outs)
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("local", 1)], functions=functions
    )


def test_outputs_downstream_of_random_nodes_are_found_and_the_others_are_not() -> None:
    model = _graph(
        [
            helper.make_node("RandomNormalLike", ["x"], ["noise"], name="draw"),
            helper.make_node("Add", ["x", "noise"], ["noisy"], name="add"),
            helper.make_node("Relu", ["x"], ["clean"], name="relu"),
        ],
        ["noisy", "clean"],
    )
    assert random_outputs(model) == {"noisy": ("RandomNormalLike 'draw'",)}


def test_random_nodes_inside_functions_subgraphs_and_training_dropout_count() -> None:
    body = helper.make_graph(
        [helper.make_node("RandomUniformLike", ["x"], ["u"], name="inner")],
        "then",
        [],
        [helper.make_tensor_value_info("u", onnx.TensorProto.FLOAT, [4])],
    )
    noise = helper.make_function(
        "local", "Noise", ["a"], ["b"], [helper.make_node("Bernoulli", ["a"], ["b"])], [helper.make_opsetid("", 18)]
    )
    model = _graph(
        [
            helper.make_node("Constant", [], ["flag"], value=helper.make_tensor("t", onnx.TensorProto.BOOL, [], [1])),
            helper.make_node("If", ["flag"], ["branch"], name="if", then_branch=body, else_branch=body),
            helper.make_node("Noise", ["x"], ["called"], name="call", domain="local"),
            helper.make_node("Dropout", ["x", "", "flag"], ["dropped"], name="drop"),
            helper.make_node("Dropout", ["x"], ["kept"], name="eval_drop"),
        ],
        ["branch", "called", "dropped", "kept"],
        functions=[noise],
    )
    found = random_outputs(model)
    assert set(found) == {"branch", "called", "dropped"}
    assert found["called"] == ("Noise 'call'",)
    assert "kept" not in random_tensors(model)


def test_same_distribution_passes_and_a_shifted_one_fails_with_enough_values() -> None:
    rng = np.random.default_rng(1)
    same = DistributionAccumulator(("RandomNormalLike 'n'",))
    shifted = DistributionAccumulator(("RandomNormalLike 'n'",))
    for _ in range(4):
        same.add(rng.standard_normal((32, 32)), rng.standard_normal((32, 32)))
        shifted.add(rng.uniform(size=(32, 32)), rng.standard_normal((32, 32)))
    assert same.result().passed and same.result().elements == 4096
    result = shifted.result()
    assert not result.passed and result.ks_distance > result.ks_bound
    assert "KS distance" in result.note and ">" in result.note and result.outside == result.elements


def test_few_values_cannot_fail_but_a_wrong_shape_or_kind_does() -> None:
    few = DistributionAccumulator(("Bernoulli 'b'",))
    few.add(np.array(1.0), np.array(0.0))  # one value each: too few to tell distributions apart
    assert few.result().passed and few.result().ks_bound > 1.0
    shaped = DistributionAccumulator(("Bernoulli 'b'",))
    shaped.add(np.zeros(3), np.zeros(4))
    assert not shaped.result().passed and "shape [3]" in shaped.result().note
    kinds = DistributionAccumulator(("Multinomial 'm'",))
    kinds.add(np.zeros(3, dtype=np.float32), np.zeros(3, dtype=np.int64))
    assert not kinds.result().passed and "float values" in kinds.result().note


def test_ks_distance_counts_nan_as_infinity() -> None:
    assert ks_distance(np.array([np.inf, 1.0]), np.array([1.0, 2.0])) == 0.5


class Noisy(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn_like(x) * x, x.sum()


def test_compare_judges_random_outputs_by_distribution_and_others_elementwise(tmp_path: object) -> None:
    report = pipeline.compare(Noisy().eval(), torch.ones(64, 64), backends="onnxruntime", output_dir=tmp_path)
    assert report.passed
    by_output = {o.output: o.to_dict() for o in report.outputs}
    assert by_output["out_0"]["judged_by"] == "distribution" and "RandomNormalLike" in by_output["out_0"]["note"]
    assert by_output["out_1"]["judged_by"] == "elementwise" and by_output["out_1"]["elements"] == 4  # 0-d, 4 inputs
    markdown = (tmp_path / "report.md").read_text()  # type: ignore[operator]
    assert "(random: by distribution)" in markdown and "Kolmogorov-Smirnov" in markdown


class NoiseBlock(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.randn_like(x)


class WithNoiseBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(32, 32)
        self.noise = NoiseBlock()
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.noise(self.lin(x)))


def test_per_layer_judges_modules_after_a_random_node_by_distribution(tmp_path: object) -> None:
    torch.manual_seed(0)
    report = pipeline.compare(
        WithNoiseBlock().eval(), torch.randn(64, 32), per_layer=True, random_inputs=1, output_dir=tmp_path
    )
    assert report.layers is not None and report.first_divergence is None and report.passed
    rows = {layer.module: layer for layer in report.layers.layers}
    assert rows["lin"].stats.max_abs < 1e-4  # type: ignore[union-attr]  # before the noise: element by element
    assert "RandomNormalLike" in rows["noise"].stats.note  # type: ignore[union-attr]
    assert "(random: by distribution)" in (tmp_path / "report.md").read_text()  # type: ignore[operator]


def test_a_dimension_sized_by_data_may_differ_and_another_may_not() -> None:
    drawn = DistributionAccumulator(("RandomNormalLike 'n'",), free_dims=(1,))
    rng = np.random.default_rng(2)
    drawn.add(rng.standard_normal((2, 300)), rng.standard_normal((2, 500)))
    result = drawn.result()
    assert result.passed and "dimension 1 sized by data" in result.note
    fixed = DistributionAccumulator(("RandomNormalLike 'n'",), free_dims=(1,))
    fixed.add(rng.standard_normal((3, 300)), rng.standard_normal((2, 300)))
    assert not fixed.result().passed and "shape [3, 300]" in fixed.result().note


def _shared_offset_draw(rng: np.random.Generator, scale: float = 1.0) -> np.ndarray:
    """Values that share one draw (a per-call offset), as a generated waveform's do: far from independent."""
    return scale * (rng.standard_normal(4000) + 0.3 * rng.standard_normal())


def test_values_sharing_a_draw_are_judged_against_pytorchs_own_spread() -> None:
    rng = np.random.default_rng(3)
    accumulators = {"right": DistributionAccumulator(("RandomNormalLike 'n'",))}
    accumulators["scaled"] = DistributionAccumulator(("RandomNormalLike 'n'",))
    feeds = [0, 1, 2, 3]
    for _ in feeds:
        reference = _shared_offset_draw(rng)
        accumulators["right"].add(_shared_offset_draw(rng), reference)
        accumulators["scaled"].add(_shared_offset_draw(rng, scale=4.0), reference)
    assert not accumulators["right"].result().passed  # independent values' bound: the offsets differ
    calls = []

    def torch_call(feed: int) -> dict[str, np.ndarray]:
        calls.append(feed)
        draw = _shared_offset_draw(rng)
        return {"right": draw, "scaled": draw}

    measured = measure_torch_spread(accumulators.items(), torch_call, feeds)
    assert set(measured) == {"right", "scaled"} and calls == feeds * YARDSTICK_DRAWS
    right, scaled = accumulators["right"].result(), accumulators["scaled"].result()
    assert right.passed and right.torch_spread is not None and "within 2x" in right.note
    assert not scaled.passed and "beyond 2x" in scaled.note  # a wrong scale stays a failure


class DrawnLength(nn.Module):
    """A length drawn by the model (as VITS's stochastic durations draw its waveform's), values sharing a draw."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        durations = torch.ceil(torch.rand(x.shape[-1]) * 4).long()
        frames = torch.repeat_interleave(x, durations, dim=-1)
        return torch.tanh(frames + torch.randn_like(frames) * 0.3 + torch.randn(()))


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_a_model_drawing_its_output_length_converts_and_validates(precision: str) -> None:
    torch.manual_seed(0)
    module = pipeline.convert(DrawnLength().eval(), torch.randn(2, 64), precision=precision, backend="onnxruntime")
    (output,) = module.report.accuracy.outputs  # type: ignore[union-attr]
    assert output.passed and "RandomNormalLike" in output.note
    assert module(torch.randn(2, 64)).shape[0] == 2
    if precision == "fp16":  # a random output is not scored value by value: no search for an error it cannot mend
        assert module.report.precision is not None and module.report.precision.search is None
