"""TensorRT segments with an ONNX Runtime fallback: a model holding ops TensorRT-RTX rejects (a user's op with a
plugin only NVIDIA TensorRT loads, NonZero, Unique, and an If whose branch holds a NonZero) and a random draw
(Bernoulli, rewritten to a uniform draw TensorRT takes), converted with dynamic batch; every TensorRT segment built
by the real TensorRT-RTX builder, the whole (each engine run by its ONNX Runtime stand-in) validated against
PyTorch, saved and loaded. The partition itself is checked on small graphs.
"""

from __future__ import annotations

import warnings
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper
from torch import nn

import converters
import pipeline
from pipeline.backends.segments.build import SegmentFallbackWarning, build_segmented
from pipeline.conversion import check_for_backend
from pipeline.precision.buildable import rtx_available
from pipeline.runtime.segments.executor import SegmentedExecutor
from pipeline.runtime.segments.partition import partition
from pipeline.settings import Settings

pytestmark = pytest.mark.skipif(not rtx_available(), reason="TensorRT-RTX is not installed")


@torch.library.custom_op("segtest::clip_half", mutates_args=())
def clip_half(x: torch.Tensor) -> torch.Tensor:
    return torch.clamp(x, max=float(x.max()) * 0.5)


@clip_half.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class Mixed(nn.Module):
    """Linear layers around ops TensorRT-RTX cannot take; ``noise`` is random (Bernoulli, drawn inside a
    TensorRT segment), judged by distribution."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.middle, self.last = nn.Linear(8, 16), nn.Linear(16, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.ops.segtest.clip_half(torch.relu(self.first(x)))
        kept = h[h > 0.1].sum()
        distinct = torch.unique(torch.round(h * 4)).sum()
        gated = torch.cond(kept > 0, lambda t: t[t > 0.2].sum() * t, lambda t: t * 2, (h,))
        out = self.last(torch.tanh(self.middle(gated))) + kept + distinct
        return out, torch.bernoulli(torch.full_like(h, 0.5)) * h


Converted = tuple[pipeline.ConvertedModule, Mixed, list[warnings.WarningMessage]]


@pytest.fixture(scope="module")
def converted() -> Converted:
    torch.manual_seed(0)
    model = Mixed().eval()
    registry = converters.default_registry()
    registry.register_plugin("segtest::clip_half")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = pipeline.convert(
            model,
            torch.randn(4, 8),
            converters=registry,
            backend="tensorrt-rtx",
            dynamic={"x": {0: ("batch", 1, 4, 16)}},
            min_segment_size=1,
            trt_engine_cache=False,
        )
    return module, model, list(caught)


def test_rejected_nodes_run_on_onnx_runtime_and_the_rest_in_tensorrt_rtx_engines(converted: Converted) -> None:
    module, _, caught = converted
    report = module.report.segments
    assert report is not None and module.report.accuracy is not None and module.report.accuracy.passed
    assert {n.op for n in report.left_out} == {"clip_half", "NonZero", "Unique", "If"}
    reasons = {n.op: n.reason for n in report.left_out}
    assert "TensorRT-RTX loads no plugins" in reasons["clip_half"]
    assert "in its subgraph, NonZero" in reasons["If"] and "checkUnique" in reasons["Unique"]
    assert report.share == 1.0 and report.basis == "MatMul/Gemm/Conv FLOPs"  # every Gemm is inside TensorRT
    fallback = [w for w in caught if issubclass(w.category, SegmentFallbackWarning)]
    assert len(fallback) == 1 and "NonZero x" in str(fallback[0].message) and "100.0%" in str(fallback[0].message)
    executor = module._executor
    assert isinstance(executor, SegmentedExecutor)
    trt = [i for i, s in enumerate(executor.plan) if s.kind == "tensorrt"]
    assert len(trt) >= 2 and sorted(executor.segment_engines()) == trt  # one TensorRT-RTX engine per segment
    assert all("ONNX Runtime stand-in" in report.segments[i].status for i in trt)
    assert f"segments  {len(report.left_out)} of {report.total_nodes} node(s)" in module.report.summary()


def test_segments_read_only_graph_inputs_and_earlier_segments(converted: Converted) -> None:
    module, _, _ = converted
    executor = module._executor
    available = {t.name for t in module.io.inputs}
    for segment in executor.plan:
        assert {s.name for s in segment.inputs} <= available, "a segment reads a value of a later segment"
        available |= {s.name for s in segment.outputs}
    covered = sorted(i for s in executor.plan for i in s.nodes)
    assert covered == list(range(len(module.onnx.graph.node)))  # every node in exactly one segment


def test_dynamic_batch_matches_pytorch_and_the_artifact_keeps_every_engine(
    converted: Converted, tmp_path: Path
) -> None:
    module, model, _ = converted
    path = module.save(tmp_path / "mixed.ptrt")
    with zipfile.ZipFile(path) as archive:
        members = {n: archive.read(n) for n in archive.namelist() if n.startswith("engine-segment-")}
    engines = module._executor.segment_engines()
    assert {f"engine-segment-{i}.plan": e for i, e in engines.items()} == members
    loaded = pipeline.load(path)
    assert loaded.report.segments == module.report.segments
    for batch in (1, 16):
        x = torch.randn(batch, 8)
        expected, _ = model(x)
        for candidate in (module, loaded):
            out, noise = candidate(x)
            torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
            assert set(torch.unique((noise != 0).float()).tolist()) <= {0.0, 1.0}


def test_fallback_error_refuses_and_fallback_ops_moves_ops_out(converted: Converted) -> None:
    module, _, _ = converted
    with pytest.raises(pipeline.BuildError, match="TensorRT-RTX cannot build"):
        check_for_backend(module.onnx, "tensorrt-rtx", Settings(fallback="error"))
    settings = Settings(fallback_ops=("Tanh",), min_segment_size=1, trt_engine_cache=False, validation_inputs=0)
    compatibility = check_for_backend(module.onnx, "tensorrt-rtx", settings)
    feeds = [{"x": np.random.default_rng(0).standard_normal((4, 8), dtype=np.float32)}]
    with pytest.warns(SegmentFallbackWarning, match="Tanh x1"):
        _, report = build_segmented("tensorrt-rtx", module.onnx, module.io, settings, compatibility, feeds)
    assert [n.reason for n in report.left_out if n.op == "Tanh"] == ["fallback_ops"]
    assert report.engines >= 2


def test_fallback_settings_are_checked() -> None:
    with pytest.raises(pipeline.InputError, match="unknown fallback 'cpu'"):
        Settings(fallback="cpu")  # type: ignore[arg-type]
    with pytest.raises(pipeline.InputError, match="min_segment_size must be >= 1"):
        Settings(min_segment_size=0)
    with pytest.raises(pipeline.InputError, match="fallback='error' forbids it"):
        Settings(fallback="error", fallback_ops=("NonZero",))


# -- the partition on small graphs ----------------------------------------------------------------------------------


def _model(nodes: list[onnx.NodeProto], outputs: list[str]) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, [4]) for o in outputs],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _diamond() -> onnx.ModelProto:
    """a feeds both the excluded b and c, and d reads both: one TensorRT segment of {a, c, d} would be a cycle."""
    return _model(
        [
            helper.make_node("Relu", ["x"], ["a"], name="a"),
            helper.make_node("Neg", ["a"], ["b"], name="b"),
            helper.make_node("Sigmoid", ["a"], ["c"], name="c"),
            helper.make_node("Add", ["b", "c"], ["d"], name="d"),
        ],
        ["d"],
    )


def test_partition_splits_around_an_excluded_node_without_a_cycle() -> None:
    segments = partition(_diamond(), excluded=[1])
    assert [(s.kind, s.nodes) for s in segments] == [("tensorrt", (0, 2)), ("onnxruntime", (1,)), ("tensorrt", (3,))]
    assert [(s.inputs, s.outputs) for s in segments] == [(("x",), ("a", "c")), (("a",), ("b",)), (("b", "c"), ("d",))]


def test_min_segment_size_sends_small_tensorrt_runs_to_onnx_runtime() -> None:
    segments = partition(_diamond(), excluded=[1], min_segment_size=2)
    assert [(s.kind, s.nodes) for s in segments] == [("tensorrt", (0, 2)), ("onnxruntime", (1, 3))]
    assert partition(_diamond(), excluded=[1], min_segment_size=3)[0].kind == "onnxruntime"


def test_an_if_stays_whole_and_its_branches_outer_reads_are_segment_inputs() -> None:
    branch = helper.make_graph(
        [helper.make_node("Mul", ["a", "a"], ["t"], name="inner")],
        "then",
        [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, [4])],
    )
    other = helper.make_graph(
        [helper.make_node("Neg", ["a"], ["e"], name="inner_else")],
        "else",
        [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, [4])],
    )
    model = _model(
        [
            helper.make_node("Relu", ["x"], ["a"], name="a"),
            helper.make_node("ReduceSum", ["a"], ["s"], name="s", keepdims=0),
            helper.make_node("Cast", ["s"], ["flag"], name="flag", to=TensorProto.BOOL),
            helper.make_node("If", ["flag"], ["y"], name="if", then_branch=branch, else_branch=other),
            helper.make_node("Exp", ["y"], ["z"], name="z"),
        ],
        ["z"],
    )
    segments = partition(model, excluded=[3])
    assert [(s.kind, s.nodes) for s in segments] == [("tensorrt", (0, 1, 2)), ("onnxruntime", (3,)), ("tensorrt", (4,))]
    assert segments[1].inputs == ("flag", "a") and segments[0].outputs == ("a", "flag")


def test_a_plan_round_trips_through_json(converted: Converted) -> None:
    from pipeline.runtime.segments.executor import PlannedSegment

    module, _, _ = converted
    for segment in module._executor.plan:
        assert PlannedSegment.from_json(segment.to_json()) == segment
        onnx.checker.check_model(segment.model(module.onnx), full_check=True)


MASKED_SUM = """
import torch


class MaskedSum(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.sigmoid(self.linear(x))
        return y * y[y > 0.5].sum()


def build():
    torch.manual_seed(0)
    return MaskedSum().eval(), torch.randn(2, 8)
"""


def test_cli_flags_reach_the_segments(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from pipeline.cli import build_parser, main
    from pipeline.cli.common import conversion_options

    args = build_parser().parse_args(["convert", "m:build", "-o", "out", "--fallback", "error"])
    assert conversion_options(args)["fallback"] == "error"
    (tmp_path / "masked_sum.py").write_text(MASKED_SUM)
    out = tmp_path / "out"
    argv = ["convert", f"{tmp_path / 'masked_sum.py'}:build", "--backend", "tensorrt-rtx", "-o", str(out)]
    with pytest.warns(SegmentFallbackWarning, match=r"\(Sigmoid x1, NonZero x1\)"):
        code = main([*argv, "--min-segment-size", "1", "--fallback-ops", "Sigmoid,Gelu"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "left out  Sigmoid" in printed and "fallback_ops" in printed and "accuracy  PASS" in printed
    loaded = pipeline.load(out / "model.ptrt")
    assert loaded.report.segments is not None
    namespace: dict[str, object] = {}
    exec(MASKED_SUM, namespace)  # the same model with new weights: refit rebuilds each segment's engine
    new_model = namespace["MaskedSum"]().eval()  # type: ignore[operator]
    x = torch.randn(2, 8)
    pipeline.refit(loaded, new_model, sample=x)
    torch.testing.assert_close(loaded(x), new_model(x), rtol=1e-4, atol=1e-5)
    assert loaded.report.segments is not None and loaded.report.accuracy is not None
    assert main(["inspect", str(out / "model.ptrt")]) == 0
    assert "TensorRT segment engine(s)" in capsys.readouterr().out


def test_a_segments_profiles_are_the_users_over_the_dimensions_it_has() -> None:
    """A generation step has two profiles (prefill and decode) over ``batch`` and ``sequence``. A segment past the
    first has ``batch`` but not ``sequence``: its settings keep each profile's ``batch`` range and leave ``sequence``
    out (it raised "profiles name dimension 'sequence', which dynamic= does not declare" on Kimi K2.5's fp16 step); a
    segment with neither builds one profile over its own dimensions."""
    from pipeline.runtime.segments.executor import PlannedSegment
    from pipeline.settings import DynamicDim, Settings

    dims = [DynamicDim("input_ids", 0, "batch", 1, 2, 8), DynamicDim("input_ids", 1, "sequence", 1, 7, 32)]
    prefill, decode = {"batch": (1, 2, 8), "sequence": (2, 7, 32)}, {"batch": (1, 4, 8), "sequence": (1, 1, 1)}
    settings = Settings(dynamic=tuple(dims), profiles=[prefill, decode])
    later = PlannedSegment("tensorrt", (3,), (), (), (DynamicDim("x", 0, "batch", 1, 2, 8),))
    kept = later.settings(settings).profiles
    assert [[(r.name, r.min, r.opt, r.max) for r in p] for p in kept] == [[("batch", 1, 2, 8)], [("batch", 1, 4, 8)]]
    inner = PlannedSegment("tensorrt", (4,), (), (), (DynamicDim("y", 0, "y:0", 1, 3, 64),))
    assert inner.settings(settings).profiles == () and inner.settings(settings).dynamic == inner.dynamic
