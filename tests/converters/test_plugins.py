"""Plugins from torch.library ops: the plugin node, its CPU reference on ONNX Runtime, shapes, artifacts, errors.

The ops below have no ONNX decomposition on purpose (top-k masks and index lists are data dependent), so the
only way through is the plugin node; ONNX Runtime runs it through onnxruntime-extensions and the op's own code.
The tensorrt.plugin side is checked against the real bindings in ``test_plugins_tensorrt.py``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from torch import nn

import converters
import pipeline
from converters.plugins import shapes as plugin_shapes
from converters.plugins.spec import plugin_spec
from pipeline.runtime import plugins as plugin_runtime

ROOT = Path(__file__).resolve().parents[2]


@torch.library.custom_op("plugtest::topk_keep", mutates_args=())
def topk_keep(x: torch.Tensor, k: int, fill: float, largest: bool, mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    idx = torch.topk(x, k, dim=-1, largest=largest).indices
    keep = torch.zeros_like(x, dtype=torch.bool).scatter(-1, idx, True)
    kept = x if mode == "keep" else torch.ones_like(x)
    return torch.where(keep, kept, torch.full_like(x, fill)), idx


@topk_keep.register_fake
def _(x: torch.Tensor, k: int, fill: float, largest: bool, mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(x), x.new_empty((*x.shape[:-1], k), dtype=torch.int64)


@torch.library.custom_op("plugtest::weighted_pick", mutates_args=())
def weighted_pick(x: torch.Tensor, cols: list[int], weights: list[float], negate: list[bool]) -> torch.Tensor:
    signs = torch.tensor([-w if n else w for w, n in zip(weights, negate, strict=True)], dtype=x.dtype)
    return x[..., cols] * signs


@weighted_pick.register_fake
def _(x: torch.Tensor, cols: list[int], weights: list[float], negate: list[bool]) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], len(cols)))


@torch.library.custom_op("plugtest::checked_log", mutates_args=())
def checked_log(x: torch.Tensor) -> torch.Tensor:
    if bool((x <= 0).any()):
        raise ValueError("checked_log takes positive inputs only")
    return torch.log(x)


@checked_log.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("plugtest::stack_halves", mutates_args=())
def stack_halves(x: torch.Tensor, y: torch.Tensor, group: int) -> torch.Tensor:
    both = torch.cat([x, y], 0)
    return both[: both.shape[0] // group * group].reshape(-1, group * x.shape[1])


@stack_halves.register_fake
def _(x: torch.Tensor, y: torch.Tensor, group: int) -> torch.Tensor:
    return x.new_empty(((x.shape[0] + y.shape[0]) // group, group * x.shape[1]))


class TopK(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        masked, idx = torch.ops.plugtest.topk_keep(x * 2.0, 3, -1.5, True, "keep")
        marks, _ = torch.ops.plugtest.topk_keep(x, 2, 0.0, False, "mark")
        return masked + marks, idx


def plugin_registry(*ops: str) -> converters.ConverterRegistry:
    registry = converters.ConverterRegistry()
    for op in ops:
        converters.register_plugin(op, registry=registry)
    return registry


@pytest.fixture(scope="module")
def topk_module() -> pipeline.ConvertedModule:
    return pipeline.convert(
        TopK(),
        torch.randn(4, 10),
        converters=plugin_registry("plugtest::topk_keep"),
        backend="onnxruntime",
        dynamic={"x": {0: ("batch", 1, 4, 16)}},
    )


def attributes(node: onnx.NodeProto) -> dict[str, object]:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def test_data_dependent_op_runs_through_the_plugin_node_and_matches_torch(
    topk_module: pipeline.ConvertedModule,
) -> None:
    nodes = [n for n in topk_module.onnx.graph.node if n.op_type == "topk_keep"]
    assert len(nodes) == 2 and all(n.domain == "ai.onnx.contrib" for n in nodes)
    keep = next(n for n in nodes if attributes(n)["mode"] == b"keep")
    assert attributes(keep) == {
        "k": 3,
        "fill": -1.5,
        "largest": 1,
        "mode": b"keep",
        "plugin_namespace": b"plugtest",
        "plugin_version": b"1",
        "plugin_torch_op": b"plugtest::topk_keep.default",
        "plugin_module": __name__.encode(),
    }
    assert {n.domain for n in topk_module.onnx.graph.node} == {"", "ai.onnx.contrib"}  # nothing opaque is left
    assert topk_module.report.accuracy is not None and topk_module.report.accuracy.passed
    model = TopK()
    for batch in (1, 7, 16):  # dynamic batch, both outputs (float and int64), every attribute kind
        x = torch.randn(batch, 10)
        torch.testing.assert_close(topk_module(x), model(x), rtol=0, atol=0)


def test_plugin_node_passes_the_static_tensorrt_check_as_a_plugin(topk_module: pipeline.ConvertedModule) -> None:
    report = pipeline.check(topk_module.onnx, trt_version="10.16")
    plugins = [n for n in report.nodes if n.status == "plugin"]
    assert report.ok and [n.op for n in plugins] == ["topk_keep", "topk_keep"]
    assert topk_module.report.compatibility["plugins"][0]["op"] == "topk_keep"


def test_list_attributes_are_json_strings_both_runtimes_read() -> None:
    class Pick(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.ops.plugtest.weighted_pick(x, [4, 0, 2], [0.5, 2.0, -1.25], [False, True, True]) + 1

    module = pipeline.convert(
        Pick(), torch.randn(3, 6), converters=plugin_registry("plugtest::weighted_pick"), backend="onnxruntime"
    )
    node = next(n for n in module.onnx.graph.node if n.op_type == "weighted_pick")
    assert attributes(node)["cols"] == b"[4, 0, 2]" and attributes(node)["negate"] == b"[false, true, true]"
    x = torch.randn(3, 6)
    torch.testing.assert_close(module(x), Pick()(x))
    # what tensorrt.plugin hands over: numbers as one-element arrays, strings NUL-terminated
    spec = plugin_spec(torch.ops.plugtest.weighted_pick.default)
    raw = {"cols": "[4, 0, 2]\x00", "weights": b"[0.5, 2.0, -1.25]", "negate": "[false, true, true]"}
    assert spec.decode(raw) == {"cols": [4, 0, 2], "weights": [0.5, 2.0, -1.25], "negate": [False, True, True]}
    scalars = plugin_spec(torch.ops.plugtest.topk_keep.default).decode(
        {
            "k": np.array([3], np.int32),
            "fill": np.array([-1.5], np.float32),
            "largest": np.array([0], np.int32),
            "mode": "keep\x00",
        }
    )
    assert scalars == {"k": 3, "fill": -1.5, "largest": False, "mode": "keep"}


def test_a_failing_reference_raises_the_ops_own_error_instead_of_aborting() -> None:
    class Log(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.ops.plugtest.checked_log(x) * 2

    module = pipeline.convert(
        Log(),
        torch.rand(2, 3) + 0.5,
        converters=plugin_registry("plugtest::checked_log"),
        backend="onnxruntime",
        validate=False,
    )
    x = torch.rand(2, 3) + 0.5
    torch.testing.assert_close(module(x), Log()(x))
    with pytest.raises(ValueError, match="positive inputs only"):
        module(-x)
    torch.testing.assert_close(module(x), Log()(x))  # the session is still usable


def test_sessions_made_before_newer_cpu_references_are_remade_and_never_freed(
    topk_module: pipeline.ConvertedModule,
) -> None:
    """onnxruntime-extensions hands ONNX Runtime pointers into a vector of Python ops that moves as it grows;
    running (or freeing) a session made before that segfaulted here. Many registrations make it move for sure."""
    x = torch.randn(6, 10)
    torch.testing.assert_close(topk_module(x), TopK()(x))
    older = pipeline.convert(
        TopK(),
        torch.randn(2, 10),
        converters=plugin_registry("plugtest::topk_keep"),
        backend="onnxruntime",
        validate=False,
    )
    for i in range(40):
        spec = plugin_spec(torch.ops.plugtest.checked_log.default, name=f"checked_log_{i}")
        plugin_runtime.register_cpu_reference(spec, [np.dtype(np.float32)], [np.dtype(np.float32)])
    junk = [bytearray(b"\xff" * 64) for _ in range(100_000)]  # reuse what the vector freed
    torch.testing.assert_close(topk_module(x), TopK()(x))
    del older, junk  # freeing a stale session would segfault: it is kept instead


def test_fake_kernel_gives_symbolic_output_sizes_over_the_dynamic_dims() -> None:
    spec = plugin_spec(torch.ops.plugtest.stack_halves.default)
    outputs, symbols = plugin_shapes.fake_outputs(spec, [torch.float32] * 2, [[None, 5], [None, 5]], {"group": 2})
    (out,) = outputs
    assert out.dtype == torch.float32 and out.sizes[1] == 10 and sorted(symbols.values()) == [(0, 0), (1, 0)]
    recorded = plugin_shapes.evaluate(out.sizes[0], {s: _Text(f"in{i}[{a}]") for s, (i, a) in symbols.items()}, _TEXT)
    assert recorded.text in ("((in0[0] + in1[0]) // 2)", "((in1[0] + in0[0]) // 2)")  # symbolic, from the inputs
    for rows_x, rows_y in ((3, 5), (8, 1)):
        real = stack_halves(torch.randn(rows_x, 5), torch.randn(rows_y, 5), 2)
        values = {s: (rows_x, rows_y)[i] for s, (i, _) in symbols.items()}
        assert [plugin_shapes.evaluate(s, values, plugin_shapes.INTEGERS) for s in out.sizes] == list(real.shape)
    # dims TensorRT knows at build time are used as constants: nothing symbolic is left
    fixed, none = plugin_shapes.fake_outputs(spec, [torch.float32] * 2, [[6, 5], [4, 5]], {"group": 2})
    assert fixed[0].sizes == (5, 10) and none == {}


class _Text:
    """A stand-in shape expression that records the arithmetic done on it, like tensorrt.plugin's ShapeExpr
    (no reflected operators: the evaluator must keep it on the left)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __add__(self, other: _Text) -> _Text:
        return _Text(f"({self.text} + {other.text})")

    def __sub__(self, other: _Text) -> _Text:
        return _Text(f"({self.text} - {other.text})")

    def __mul__(self, other: _Text) -> _Text:
        return _Text(f"({self.text} * {other.text})")

    def __floordiv__(self, other: _Text) -> _Text:
        return _Text(f"({self.text} // {other.text})")


_TEXT = plugin_shapes.Algebra(
    constant=lambda v: _Text(str(v)),
    max=lambda a, b: _Text(f"max({a.text}, {b.text})"),
    min=lambda a, b: _Text(f"min({a.text}, {b.text})"),
    cdiv=lambda a, b: _Text(f"cdiv({a.text}, {b.text})"),
)


def test_saved_artifact_reregisters_the_cpu_reference_in_a_new_process(
    topk_module: pipeline.ConvertedModule, tmp_path: Path
) -> None:
    path = topk_module.save(tmp_path / "topk.ptrt")
    x = torch.randn(5, 10)
    np.save(tmp_path / "x.npy", x.numpy())
    metadata = json.loads(__import__("zipfile").ZipFile(path).read("metadata.json"))
    assert metadata["plugins"] == [
        {"plugin": "plugtest::topk_keep", "version": "1", "torch_op": "plugtest::topk_keep.default", "module": __name__}
    ]
    script = (
        "import sys, numpy as np, torch, pipeline\n"
        "assert not hasattr(torch.ops.plugtest, 'topk_keep')\n"
        f"module = pipeline.load({str(path)!r})\n"
        f"masked, idx = module(torch.from_numpy(np.load({str(tmp_path / 'x.npy')!r})))\n"
        f"np.save({str(tmp_path / 'masked.npy')!r}, masked.numpy())\n"
        f"np.save({str(tmp_path / 'idx.npy')!r}, idx.numpy())\n"
        f"print({__name__!r} in sys.modules)\n"
    )
    paths = [str(Path(__file__).parent), str(ROOT), os.environ.get("PYTHONPATH", "")]
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["True"]  # pipeline.load imported the module that defines the op
    masked, idx = TopK()(x)
    np.testing.assert_array_equal(np.load(tmp_path / "masked.npy"), masked.numpy())
    np.testing.assert_array_equal(np.load(tmp_path / "idx.npy"), idx.numpy())


def test_register_plugin_explains_what_cannot_be_a_plugin() -> None:
    registry = converters.ConverterRegistry()
    with pytest.raises(converters.ConversionError, match="not a torch op"):
        converters.register_plugin("Gelu", registry=registry)
    lib = torch.library.Library("plugbad", "FRAGMENT")  # noqa: TID251 - schemas custom_op cannot write
    lib.define("opt(Tensor x, int? k) -> Tensor")
    lib.define("named(Tensor x, int stream) -> Tensor")
    lib.define("late(int k, Tensor x) -> Tensor")
    with pytest.raises(converters.ConversionError, match=r"'k' \(Optional\[int\]\).*\n  fix: plugins take"):
        converters.register_plugin("plugbad::opt", registry=registry)
    with pytest.raises(converters.ConversionError, match="'stream'.*attribute name"):
        converters.register_plugin("plugbad::named", registry=registry)
    with pytest.raises(converters.ConversionError, match="comes after a non-tensor argument"):
        converters.register_plugin("plugbad::late", registry=registry)
    with pytest.raises(converters.ConversionError, match="cannot name a tensorrt.plugin"):
        converters.register_plugin("plugtest::topk_keep", registry=registry, namespace="trt")
    assert list(registry.op_keys()) == []


def test_ctx_plugin_builds_the_node_of_a_hand_written_plugin() -> None:
    """A C++ plugin (or a hand-made tensorrt.plugin): the converter writes the node, the user registers the rest."""
    from converters.settings import Settings
    from passes import default_passes

    def to_my_plugin(ctx: converters.ConverterContext) -> object:
        return ctx.plugin(
            "MyLog_TRT", [ctx.inputs[0]], {"eps": 1e-6, "axes": np.array([1, 0])}, namespace="", version="2"
        )

    class Log(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.ops.plugtest.checked_log(x)

    registry = converters.ConverterRegistry()
    registry.register("plugtest::checked_log")(to_my_plugin)
    exported = pipeline.export(Log(), torch.rand(2, 3) + 1, Settings(), None, registry.torch_ops())
    final, _ = pipeline.run_passes(exported, Settings(), default_passes(registry))
    (node,) = final.graph.node
    assert (node.op_type, node.domain) == ("MyLog_TRT", "ai.onnx.contrib")
    assert attributes(node) == {
        "eps": pytest.approx(1e-6),
        "axes": [1, 0],
        "plugin_namespace": b"",
        "plugin_version": b"2",
    }
    assert [n.status for n in pipeline.check(final).nodes] == ["plugin"]


def test_attribute_encoding_rules() -> None:
    from converters.plugins.nodes import plugin_node_attributes

    encoded = plugin_node_attributes(
        {"b": True, "i": 7, "f": 0.25, "s": "x", "l": ("a", 1), "a": np.array([1, 2], np.int32)},
        namespace="ns",
        version="1",
    )
    assert encoded == {
        "b": 1,
        "i": 7,
        "f": 0.25,
        "s": "x",
        "l": '["a", 1]',
        "a": [1, 2],
        "plugin_namespace": "ns",
        "plugin_version": "1",
    }
    with pytest.raises(converters.ConversionError, match="does not fit int32"):
        plugin_node_attributes({"i": 2**40}, namespace="ns", version="1")
    with pytest.raises(converters.ConversionError, match="reserved"):
        plugin_node_attributes({"stream": 1}, namespace="ns", version="1")


def test_cpu_reference_needs_onnxruntime_extensions_and_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime_extensions", None)
    with pytest.raises(pipeline.BuildError, match=re.escape("pip install 'torch-trt-pipeline[plugins]'")):
        plugin_runtime.extensions()


def test_float16_is_refused_before_onnxruntime_extensions_would_abort() -> None:
    spec = plugin_spec(torch.ops.plugtest.checked_log.default, name="checked_log_fp16")
    with pytest.raises(pipeline.BuildError, match="float16 .*cannot take"):
        plugin_runtime.register_cpu_reference(spec, [np.dtype(np.float16)], [np.dtype(np.float16)])


def test_two_plugins_cannot_share_a_name_on_onnxruntime(topk_module: pipeline.ConvertedModule) -> None:
    spec = plugin_spec(torch.ops.plugtest.checked_log.default, namespace="other", name="topk_keep")
    with pytest.raises(pipeline.BuildError, match="plugtest::topk_keep and other::topk_keep share the name"):
        plugin_runtime.register_cpu_reference(spec, [np.dtype(np.float32)], [np.dtype(np.float32)])


def test_restore_gives_nodes_of_older_artifacts_their_torch_op(topk_module: pipeline.ConvertedModule) -> None:
    """Artifacts written before plugin nodes recorded their torch op: the metadata's records fill it in."""
    from converters.plugins.nodes import node_torch_op, plugin_nodes
    from converters.plugins.spec import plugin_records, restore_plugins
    from pipeline.backends import build_executor

    model = onnx.ModelProto()
    model.CopyFrom(topk_module.onnx)
    records = plugin_records(model)
    for node in plugin_nodes(model):
        kept = [a for a in node.attribute if a.name not in ("plugin_torch_op", "plugin_module")]
        del node.attribute[:]
        node.attribute.extend(kept)
    assert [node_torch_op(n) for n in plugin_nodes(model)] == [None, None]
    assert plugin_records(model)[0]["torch_op"] is None
    specs = restore_plugins(records, model)
    assert [s.plugin_id for s in specs] == ["plugtest::topk_keep"]
    assert [node_torch_op(n) for n in plugin_nodes(model)] == [("plugtest::topk_keep.default", __name__)] * 2
    # the restored graph runs on ONNX Runtime like the original
    executor = build_executor("onnxruntime", model, topk_module.io, topk_module.settings)
    again = pipeline.ConvertedModule(executor, topk_module.io, model, topk_module.settings, topk_module.report)
    x = torch.randn(5, 10)
    torch.testing.assert_close(again(x), TopK()(x), rtol=0, atol=0)
