"""``pipeline.check`` on what users hand it: a module (exported first), a path, a ModelProto, an artifact; and on
what it must refuse with a clear InputError: invalid ONNX, unknown TensorRT versions, a module without a sample."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
import torch
from onnx import TensorProto, helper
from torch import nn

import pipeline


def cyclic_graph() -> onnx.ModelProto:
    nodes = [helper.make_node("Add", ["x", "b"], ["a"], name="add"), helper.make_node("Relu", ["a"], ["b"], name="r")]
    graph = helper.make_graph(
        nodes,
        "cyclic",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("b", TensorProto.FLOAT, [2])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def expect_input_error(call: object, cause: str) -> None:
    with pytest.raises(pipeline.InputError) as info:
        call()  # type: ignore[operator]
    assert cause in str(info.value) and "fix:" in str(info.value), str(info.value)


def test_module_is_exported_with_its_sample_and_judged() -> None:
    report = pipeline.check(nn.Sequential(nn.Linear(4, 3), nn.ReLU()).eval(), sample=torch.randn(2, 4))
    assert report.ok and "Relu" in {n.op for n in report.nodes}
    assert report.parser  # names its judge


def test_module_without_a_sample() -> None:
    expect_input_error(lambda: pipeline.check(nn.Linear(4, 3)), "needs the sample")


def test_sample_with_a_graph_is_refused() -> None:
    expect_input_error(lambda: pipeline.check(cyclic_graph(), sample=torch.randn(2)), "only for an nn.Module")


def test_cyclic_graph_is_invalid_onnx_not_ok() -> None:
    expect_input_error(lambda: pipeline.check(cyclic_graph(), parser="static"), "not valid ONNX")


def test_cyclic_graph_file_is_invalid_onnx(tmp_path: Path) -> None:
    onnx.save(cyclic_graph(), tmp_path / "c.onnx")
    expect_input_error(lambda: pipeline.check(tmp_path / "c.onnx"), "not valid ONNX")


@pytest.mark.parametrize("version", ["9.0", "12.0", "abc", "8.6.1"])
def test_unknown_trt_version(version: str) -> None:
    graph = pipeline.convert(nn.Linear(4, 3).eval(), torch.randn(2, 4), validate=False).onnx
    expect_input_error(lambda: pipeline.check(graph, trt_version=version), "covers TensorRT 10.x and 11.x")


def test_artifact_path_is_judged_from_its_graph(tmp_path: Path) -> None:
    path = pipeline.convert(nn.Linear(4, 3).eval(), torch.randn(2, 4), validate=False).save(tmp_path / "m.ptrt")
    report = pipeline.check(path, parser="static")
    assert report.ok and len(report.nodes) >= 1


@pytest.mark.parametrize(
    ("target", "cause"),
    [(42, "cannot check a int"), ("/nonexistent.onnx", "no ONNX model at"), (__file__, "not a readable ONNX model")],
    ids=["int", "missing", "python-file"],
)
def test_things_that_are_not_graphs(target: object, cause: str) -> None:
    expect_input_error(lambda: pipeline.check(target), cause)  # type: ignore[arg-type]


def test_unknown_parser_name() -> None:
    graph = pipeline.convert(nn.Linear(4, 3).eval(), torch.randn(2, 4), validate=False).onnx
    expect_input_error(lambda: pipeline.check(graph, parser="trtexec"), "unknown parser")
