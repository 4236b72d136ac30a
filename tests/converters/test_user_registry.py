"""The process-wide user registry: ``@converters.register`` and ``converters.register_plugin("ns::op")`` at module
level, picked up by ``pipeline.convert(model, sample)`` and by ``pipeline convert`` with no extra argument; an
explicit ``converters=`` wins; registries (plugins included) are independent instances."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import converters
import pipeline

ROOT = Path(__file__).resolve().parents[2]


@torch.library.custom_op("usertest::shift", mutates_args=())
def shift(x: torch.Tensor, by: float) -> torch.Tensor:
    return x + by


@shift.register_fake
def _(x: torch.Tensor, by: float) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("usertest::top2", mutates_args=())
def top2(x: torch.Tensor) -> torch.Tensor:
    return torch.topk(x, 2, dim=-1).values


@top2.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], 2))


class Shift(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.usertest.shift(x, 1.5) * 2


class Top2(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.usertest.top2(x) - 1


def convert_shift(ctx: converters.ConverterContext) -> object:
    return ctx.op.Add(ctx.input("x"), np.float32(ctx.attrs["by"]))


@pytest.fixture
def user_shift() -> Iterator[None]:
    """``@converters.register("usertest::shift")`` as a user writes it at module level; removed afterwards, as the
    user registry lives as long as the process."""
    converters.register("usertest::shift")(convert_shift)
    yield
    converters.user_registry().remove("usertest::shift")


def test_module_level_register_is_used_by_convert_with_no_converters_argument(user_shift: None) -> None:
    module = pipeline.convert(Shift(), torch.randn(2, 5), backend="onnxruntime")
    assert [n.op_type for n in module.onnx.graph.node] == ["Add", "Mul"]
    x = torch.randn(2, 5)
    torch.testing.assert_close(module(x), Shift()(x))
    assert module.report.accuracy is not None and module.report.accuracy.passed


def test_an_explicit_registry_wins_over_the_user_registry(user_shift: None) -> None:
    suggestion = r"usertest::shift x1.*@converters.register\('usertest::shift'\)"
    with pytest.raises(pipeline.ConversionError, match=suggestion):
        pipeline.convert(Shift(), torch.randn(2, 5), converters=converters.ConverterRegistry(), backend="onnxruntime")


def test_user_converters_come_before_the_builtins_and_default_registries_are_snapshots(user_shift: None) -> None:
    def mine(ctx: converters.ConverterContext) -> object:
        return ctx.inputs[0]

    converters.register("aten::bucketize.Tensor")(mine)
    try:
        key = converters.OpKey("aten", "bucketize.Tensor")
        first, builtin = converters.default_registry().candidates(key)
        assert first.function is mine and builtin.name == "convert_bucketize"
    finally:
        converters.user_registry().remove("aten::bucketize.Tensor", mine)
    assert [e.name for e in converters.default_registry().candidates(key)] == ["convert_bucketize"]
    snapshot = converters.default_registry()
    snapshot.remove("usertest::shift")  # a default registry is a new instance: the user registry keeps its entry
    assert "usertest::shift" in {str(k) for k in converters.user_registry().op_keys()}


def test_register_plugin_without_a_registry_goes_to_the_user_registry() -> None:
    spec = converters.register_plugin("usertest::top2")  # no registry: not a TypeError
    try:
        assert converters.user_registry().plugins() == {"usertest::top2": spec}
        module = pipeline.convert(Top2(), torch.randn(3, 6), backend="onnxruntime")
        assert [n.op_type for n in module.onnx.graph.node if n.domain == "ai.onnx.contrib"] == ["top2"]
        x = torch.randn(3, 6)
        torch.testing.assert_close(module(x), Top2()(x))
    finally:
        converters.user_registry().remove("usertest::top2")
    assert converters.user_registry().plugins() == {}


def test_two_registries_do_not_see_each_others_plugins() -> None:
    first, second = converters.ConverterRegistry(), converters.ConverterRegistry()
    first.register_plugin("usertest::top2")
    second.register_plugin("usertest::top2", name="top2_renamed")
    assert list(first.plugins()) == ["usertest::top2"] and list(second.plugins()) == ["usertest::top2_renamed"]
    assert converters.user_registry().plugins() == {} and converters.default_registry().plugins() == {}
    with pytest.raises(converters.ConversionError, match="already runs torch op usertest::top2.default"):
        first.register_plugin("usertest::shift", name="top2")
    # each graph names the op its plugin node runs: both convert and run in one process
    for registry, name in ((first, "top2"), (second, "top2_renamed")):
        module = pipeline.convert(Top2(), torch.randn(3, 6), converters=registry, backend="onnxruntime")
        assert [n.op_type for n in module.onnx.graph.node if n.domain == "ai.onnx.contrib"] == [name]
        x = torch.randn(3, 6)
        torch.testing.assert_close(module(x), Top2()(x))


def test_nothing_registers_on_import() -> None:
    script = (
        "import converters, pipeline\n"
        "user = converters.user_registry()\n"
        "print(len(list(user.op_keys())), len(user.plugins()), converters.default_registry() is not "
        "converters.default_registry())\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["0", "0", "True"]


MODEL_FILE = """
import numpy as np
import torch

import converters


@torch.library.custom_op("clitest::shift", mutates_args=())
def shift(x: torch.Tensor, by: float) -> torch.Tensor:
    return x + by


@shift.register_fake
def _(x, by):
    return torch.empty_like(x)


@converters.register("clitest::shift")
def convert_shift(ctx):
    return ctx.op.Add(ctx.input("x"), np.float32(ctx.attrs["by"]))


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.ops.clitest.shift(x, 0.5) * 3


def build():
    return Model(), torch.randn(2, 4)
"""


def test_cli_convert_uses_converters_the_model_file_registers_at_import(tmp_path: Path) -> None:
    (tmp_path / "model.py").write_text(textwrap.dedent(MODEL_FILE))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "convert",
            str(tmp_path / "model.py") + ":build",
            "-o",
            str(tmp_path / "out"),
            "--backend",
            "onnxruntime",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "out" / "model.ptrt").is_file()
    import onnx

    graph = onnx.load(str(tmp_path / "out" / "model.onnx")).graph
    assert [n.op_type for n in graph.node] == ["Add", "Mul"]
