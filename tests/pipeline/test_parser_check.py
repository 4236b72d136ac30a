"""The static TensorRT parser check: each rule on a graph that breaks it and on one that does not."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper
from onnx_models import onnx_model

import pipeline

F, I64, U8 = TensorProto.FLOAT, TensorProto.INT64, TensorProto.UINT8


model = onnx_model


def statuses(m: onnx.ModelProto, version: str = "11.1") -> dict[str, tuple[str, str]]:
    return {n.node: (n.status, n.reason) for n in pipeline.check(m, trt_version=version).nodes}


AXES = {"axes": np.array([1], np.int64)}


def reduce_model(axes_from_input: bool) -> onnx.ModelProto:
    if axes_from_input:
        return model(
            [helper.make_node("ReduceSum", ["x", "ax"], ["y"], name="r")],
            [("x", F, [2, 3]), ("ax", I64, [1])],
            [("y", F, None)],
        )
    return model(
        [helper.make_node("ReduceSum", ["x", "axes"], ["y"], name="r")], [("x", F, [2, 3])], [("y", F, None)], AXES
    )


@pytest.mark.parametrize(("bad", "expected"), [(True, "restriction violated"), (False, "supported")])
def test_reduce_axes_must_be_an_initializer(bad: bool, expected: str) -> None:
    status, reason = statuses(reduce_model(bad))["r"]
    assert status == expected
    if bad:
        assert "`axes` ('ax') must be an initializer" in reason


def test_unsupported_op_with_fix_and_version_delta() -> None:
    m = model(
        [helper.make_node("DFT", ["x", "", "axis"], ["y"], name="dft", onesided=1)],
        [("x", F, [1, 8, 1])],
        [("y", F, None)],
        {"axis": np.array(1, np.int64)},
    )
    report = pipeline.check(m, trt_version="11.1")
    (node,) = report.problems
    assert node.status == "unsupported" and "supported from 11.2" in node.reason
    assert "rewrites DFT" in node.fix
    assert pipeline.check(m, trt_version="11.4").ok


def test_unknown_op_needs_a_plugin_and_plugin_nodes_are_recognised() -> None:
    m = model(
        [
            helper.make_node("my_op", ["x"], ["a"], name="opaque", domain="mylib"),
            helper.make_node("my_plugin", ["a"], ["y"], name="plug", domain="mylib", plugin_namespace="mylib"),
        ],
        [("x", F, [2])],
        [("y", F, None)],
    )
    m.opset_import.append(helper.make_opsetid("mylib", 1))
    got = statuses(m)
    assert got["opaque"][0] == "unsupported" and "plugin named 'my_op' (namespace 'mylib')" in got["opaque"][1]
    assert got["plug"][0] == "plugin"


def test_domain_is_ignored_for_builtin_ops() -> None:
    m = model(
        [helper.make_node("Relu", ["x"], ["y"], name="relu", domain="custom.domain")], [("x", F, [2])], [("y", F, None)]
    )
    m.opset_import.append(helper.make_opsetid("custom.domain", 1))
    assert statuses(m)["relu"][0] == "supported"


def test_types_per_op() -> None:
    bad = model(
        [helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")],
        [("a", TensorProto.INT32, [2, 2]), ("b", TensorProto.INT32, [2, 2])],
        [("y", TensorProto.INT32, None)],
    )
    status, reason = statuses(bad)["mm"]
    assert status == "restriction violated" and "is INT32; MatMul takes BF16, FP16, FP32" in reason
    good = model(
        [helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")],
        [("a", F, [2, 2]), ("b", F, [2, 2])],
        [("y", F, None)],
    )
    assert statuses(good)["mm"][0] == "supported"


def test_uint8_only_at_graph_boundaries() -> None:
    inner = model(
        [
            helper.make_node("Cast", ["x"], ["u"], name="to_u8", to=U8),
            helper.make_node("Cast", ["u"], ["y"], name="back", to=F),
        ],
        [("x", F, [2])],
        [("y", F, None)],
    )
    assert "UINT8" in statuses(inner)["to_u8"][1]
    boundary = model([helper.make_node("Cast", ["x"], ["y"], name="to_u8", to=U8)], [("x", F, [2])], [("y", U8, None)])
    assert statuses(boundary)["to_u8"][0] == "supported"


@pytest.mark.parametrize(
    ("attrs", "ok"),
    [
        ({"mode": "linear"}, True),
        ({"mode": "cubic"}, True),  # the real parser takes it (calibration), though the 11.1 matrix does not list it
        ({"mode": "linear", "antialias": 1}, False),
        ({"mode": "nearest", "coordinate_transformation_mode": "tf_crop_and_resize"}, False),
    ],
)
def test_resize_modes(attrs: dict[str, object], ok: bool) -> None:
    m = model(
        [helper.make_node("Resize", ["x", "", "scales"], ["y"], name="rs", **attrs)],
        [("x", F, [1, 1, 4, 4])],
        [("y", F, None)],
        {"scales": np.array([1, 1, 2, 2], np.float32)},
    )
    assert (statuses(m)["rs"][0] == "supported") is ok


@pytest.mark.parametrize(("k", "sorted_", "ok"), [(5, 1, True), (5, 0, True), (4000, 1, False)])
def test_topk(k: int, sorted_: int, ok: bool) -> None:
    m = model(
        [helper.make_node("TopK", ["x", "k"], ["v", "i"], name="topk", sorted=sorted_)],
        [("x", F, [1, 5000])],
        [("v", F, None), ("i", I64, None)],
        {"k": np.array([k], np.int64)},
    )
    assert (statuses(m)["topk"][0] == "supported") is ok


def test_maxpool_indices_and_rank() -> None:
    used = model(
        [helper.make_node("MaxPool", ["x"], ["y", "idx"], name="mp", kernel_shape=[2, 2])],
        [("x", F, [1, 1, 4, 4])],
        [("y", F, None), ("idx", I64, None)],
    )
    assert "Indices" in statuses(used)["mp"][1]
    one_d = model(
        [helper.make_node("LpPool", ["x"], ["y"], name="mp", kernel_shape=[2])],
        [("x", F, [1, 1, 4])],
        [("y", F, None)],
    )
    assert "2D and 3D pooling" in statuses(one_d)["mp"][1]
    fine = model(
        [helper.make_node("MaxPool", ["x"], ["y"], name="mp", kernel_shape=[2, 2])],
        [("x", F, [1, 1, 4, 4])],
        [("y", F, None)],
    )
    assert statuses(fine)["mp"][0] == "supported"


def test_squeeze_without_axes_depends_on_version() -> None:
    m = model([helper.make_node("Squeeze", ["x"], ["y"], name="sq")], [("x", F, [1, 3])], [("y", F, None)])
    assert statuses(m, "11.4")["sq"][0] == "restriction violated"
    assert statuses(m, "11.5")["sq"][0] == "supported"


def test_layernorm_extra_outputs_and_dropout_training() -> None:
    ln = model(
        [helper.make_node("LayerNormalization", ["x", "s"], ["y", "mean"], name="ln")],
        [("x", F, [2, 4])],
        [("y", F, None), ("mean", F, None)],
        {"s": np.ones(4, np.float32)},
    )
    assert "only the first output" in statuses(ln)["ln"][1]
    drop = model(
        [helper.make_node("Dropout", ["x", "", "train"], ["y"], name="d")],
        [("x", F, [2])],
        [("y", F, None)],
        {"train": np.array(True)},
    )
    assert "training_mode" in statuses(drop)["d"][1]


def test_local_function_body_is_checked() -> None:
    body = helper.make_function(
        "local",
        "bad_fn",
        ["a"],
        ["b"],
        [helper.make_node("BitShift", ["a", "a"], ["b"], direction="LEFT")],
        [helper.make_opsetid("", 20)],
    )
    m = model(
        [helper.make_node("bad_fn", ["x"], ["y"], name="call", domain="local")],
        [("x", TensorProto.UINT32, [2])],
        [("y", TensorProto.UINT32, None)],
    )
    m.functions.append(body)
    m.opset_import.append(helper.make_opsetid("local", 1))
    (problem,) = pipeline.check(m, parser="static").problems
    assert problem.node.startswith("call/") and problem.op == "BitShift"


def test_exported_transformers_model_passes(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
    )
    bert = transformers.BertModel(config).eval()
    ids = torch.randint(0, 64, (2, 8))
    module = pipeline.convert(
        bert,
        ((), {"input_ids": ids, "attention_mask": torch.ones_like(ids)}),
        backend="onnxruntime",
        validate=False,
        dynamic={
            "input_ids": {0: ("batch", 1, 2, 4), 1: ("seq", 2, 8, 32)},
            "attention_mask": {0: ("batch", 1, 2, 4), 1: ("seq", 2, 8, 32)},
        },
    )
    report = pipeline.check(module.onnx, trt_version="11.1")
    assert report.ok, report.summary()
    assert module.report.compatibility is not None and module.report.compatibility["problems"] == []


def test_cli_check_exit_code(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.onnx", tmp_path / "bad.onnx"
    onnx.save(reduce_model(False), good)
    onnx.save(reduce_model(True), bad)
    run = [sys.executable, "-m", "pipeline", "check"]
    ok = subprocess.run([*run, str(good)], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and "1 supported" in ok.stdout
    failing = subprocess.run([*run, str(bad), "--trt-version", "10.16"], capture_output=True, text=True, timeout=120)
    assert failing.returncode == 1 and "TensorRT 10.16" in failing.stdout and "fix:" in failing.stdout
