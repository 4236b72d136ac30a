"""Bad input: each test asserts the error type and that the message names the cause and the fix."""

from __future__ import annotations

import ast
import importlib
import re
import zipfile
from pathlib import Path

import pytest
import torch
from torch import nn

import pipeline


class TwoInputs(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x * 2 + y


class DataDependentBranch(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # Python control flow on a tensor value: torch.export cannot trace it
            return x * 2
        return x - 1


class ReturnsNumber(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, int]:
        return x + 1, 3


@pytest.fixture(scope="module")
def linear_module() -> pipeline.ConvertedModule:
    return pipeline.convert(nn.Linear(4, 3).eval(), torch.randn(2, 4), backend="onnxruntime")


def test_not_a_module() -> None:
    with pytest.raises(pipeline.InputError, match=r"(?s)expected a torch.nn.Module, got type") as info:
        pipeline.convert(nn.Linear, torch.randn(2, 4), backend="onnxruntime")
    assert "fix:" in str(info.value)


def test_sample_of_wrong_arity() -> None:
    with pytest.raises(pipeline.InputError, match=r"(?s)do not fit forward\(x, y\).*missing a required argument: 'y'"):
        pipeline.convert(TwoInputs(), torch.randn(2, 3), backend="onnxruntime")


def test_sample_of_wrong_dtype() -> None:
    with pytest.raises(pipeline.InputError, match=r"(?s)fails on the sample in PyTorch itself.*Long") as info:
        pipeline.convert(nn.Linear(4, 3), torch.ones(2, 4, dtype=torch.int64), backend="onnxruntime")
    assert "dtypes" in str(info.value)


def test_unreadable_sample() -> None:
    with pytest.raises(pipeline.InputError, match=r"(?s)cannot read a sample of type str"):
        pipeline.convert(nn.Linear(4, 3), "x", backend="onnxruntime")


def test_model_that_fails_export_gets_reason_and_fixes() -> None:
    with pytest.raises(pipeline.ExportError) as info:
        pipeline.convert(DataDependentBranch(), torch.randn(3), backend="onnxruntime")
    text = str(info.value)
    assert text.startswith("[export] torch.export failed: GuardOnDataDependentSymNode")
    assert "data-dependent" in text.lower()  # the exporter's own reason
    assert "torch.cond" in text  # and the usual fixes


def test_non_tensor_output_is_named() -> None:
    """A Python number in the result is a constant on a static conversion (the module returns it), and named as an
    output that cannot be a graph output when the shapes are dynamic (it could vary with them)."""
    dynamic = {"x": {0: ("n", 1, 3, 4)}}
    with pytest.raises(pipeline.ExportError, match=r"(?s)output \[1\] is a int; only tensors"):
        pipeline.convert(ReturnsNumber(), torch.randn(3), backend="onnxruntime", dynamic=dynamic)
    assert pipeline.convert(ReturnsNumber(), torch.randn(3), backend="onnxruntime")(torch.zeros(3))[1] == 3


def test_unknown_setting_lists_known_ones() -> None:
    with pytest.raises(pipeline.InputError, match=r"(?s)unknown setting\(s\) precison.*known settings are: .*backend"):
        pipeline.convert(nn.Linear(4, 3), torch.randn(2, 4), precison="fp16")


def test_tensorrt_requested_where_missing_is_an_error_not_a_fallback() -> None:
    with pytest.raises(
        pipeline.BuildError, match=r"(?s)backend='tensorrt' was requested but TensorRT cannot run here"
    ) as e:
        pipeline.convert(nn.Linear(4, 3), torch.randn(2, 4), backend="tensorrt")
    assert "backend='onnxruntime'" in str(e.value)


def test_dynamic_dim_on_unknown_input() -> None:
    with pytest.raises(
        pipeline.InputError, match=r"(?s)names input 'y', which the sample does not have.*inputs are: input"
    ):
        pipeline.convert(nn.Linear(4, 3), torch.randn(2, 4), dynamic={"y": {0: ("batch", 1, 2, 8)}})


def test_dynamic_dim_with_sample_size_one() -> None:
    with pytest.raises(pipeline.InputError, match=r"(?s)size 1 on dynamic axis 0.*>= 2"):
        pipeline.convert(nn.Linear(4, 3), torch.randn(1, 4), dynamic={"input": {0: ("batch", 1, 2, 8)}})


def test_bad_dynamic_range() -> None:
    with pytest.raises(pipeline.InputError, match=r"(?s)min <= opt <= max"):
        pipeline.convert(nn.Linear(4, 3), torch.randn(2, 4), dynamic={"input": {0: ("batch", 4, 2, 8)}})


def test_accuracy_error_carries_per_output_figures() -> None:
    with pytest.raises(pipeline.AccuracyError) as info:
        # a tolerance no float computation meets: the error must report the figures, not just "failed"
        pipeline.convert(
            nn.Linear(64, 8).eval(),
            torch.randn(4, 64),
            backend="onnxruntime",
            tolerances={"float32": (0.0, 0.0)},
            validation_inputs=1,
        )
    figures = info.value.per_output["out"]
    assert figures["max_abs"] > 0 and figures["atol"] == 0.0
    assert "out: max abs" in str(info.value) and "tolerances=" in str(info.value)


def test_call_with_wrong_dtype(linear_module: pipeline.ConvertedModule) -> None:
    with pytest.raises(pipeline.InputError, match=r"(?s)input 'input' is float64, the graph takes float32"):
        linear_module(torch.randn(2, 4, dtype=torch.float64))


def test_call_with_fixed_dim_changed(linear_module: pipeline.ConvertedModule) -> None:
    with pytest.raises(pipeline.InputError, match=r"(?s)size 5 on axis 0; .*fixed size 2") as info:
        linear_module(torch.randn(5, 4))
    assert "dynamic=" in str(info.value)


def test_call_with_wrong_structure(linear_module: pipeline.ConvertedModule) -> None:
    with pytest.raises(pipeline.InputError, match=r"(?s)do not fit forward"):
        linear_module(torch.randn(2, 4), torch.randn(2, 4))


def test_corrupted_artifact(linear_module: pipeline.ConvertedModule, tmp_path: Path) -> None:
    path = linear_module.save(tmp_path / "m.ptrt")
    data = bytearray(path.read_bytes())
    start = data.find(b"ir_version") if b"ir_version" in data else len(data) // 3
    data[start + 40 : start + 48] = b"\xff" * 8  # flip bytes inside a stored member
    path.write_bytes(bytes(data))
    with pytest.raises(pipeline.ArtifactError, match=r"(?s)corrupted"):
        pipeline.load(path)


def test_truncated_artifact(linear_module: pipeline.ConvertedModule, tmp_path: Path) -> None:
    path = linear_module.save(tmp_path / "m.ptrt")
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(pipeline.ArtifactError, match=r"(?s)corrupted or not an artifact") as info:
        pipeline.load(path)
    assert "convert the model again" in str(info.value)


def test_artifact_missing_member(tmp_path: Path) -> None:
    path = tmp_path / "empty.ptrt"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("metadata.json", "{}")
    with pytest.raises(pipeline.ArtifactError, match=r"(?s)has no manifest.json: it is not an artifact"):
        pipeline.load(path)


def test_not_an_artifact(tmp_path: Path) -> None:
    with pytest.raises(pipeline.ArtifactError, match=r"(?s)no artifact at"):
        pipeline.load(tmp_path / "missing.ptrt")


class ScaleBy(nn.Module):
    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return x * scale


def test_zero_dimensional_input_converts_and_validates() -> None:
    module = pipeline.convert(ScaleBy(), (torch.randn(3), torch.tensor(2.5)), backend="onnxruntime")
    assert module.report.accuracy is not None and module.report.accuracy.passed
    torch.testing.assert_close(module(torch.ones(3), torch.tensor(0.5)), torch.full((3,), 0.5))


def test_graph_kept_in_memory_over_the_protobuf_limit_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    program_weights = importlib.import_module("pipeline.exporting.program_weights")
    monkeypatch.setattr(program_weights, "PROTOBUF_LIMIT", 1000)  # a real 2 GiB graph in memory takes minutes and 13 GB
    with pytest.raises(pipeline.ExportError, match=r"(?s)over protobuf's 2 GiB limit.*external_data_threshold"):
        pipeline.convert(nn.Linear(64, 64), torch.randn(2, 64), backend="onnxruntime", external_data_threshold=1 << 40)


# -- the code that messages suggest exists -------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]
#: a dotted name of the project's API, e.g. ``converters.register`` in "write: @converters.register('mylib::op')"
DOTTED = re.compile(r"(?<![\w.])((?:converters|pipeline|passes)(?:\.[A-Za-z_]\w*)+)(\()?")


def suggested_names() -> list[tuple[str, int, str]]:
    """Every project API name in the source's strings that suggests code: each dotted name in a ``fix=`` text,
    and each dotted call (``pipeline.convert(``) in any message or docstring; as ``(file, line, name)``."""
    found = []
    for package in ("converters", "passes", "pipeline"):
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text())
            fixes = {
                id(text)
                for keyword in ast.walk(tree)
                if isinstance(keyword, ast.keyword) and keyword.arg == "fix"
                for text in ast.walk(keyword.value)
            }
            for text in ast.walk(tree):
                if isinstance(text, ast.Constant) and isinstance(text.value, str):
                    found += [
                        (str(path.relative_to(ROOT)), text.lineno, match.group(1))
                        for match in DOTTED.finditer(text.value)
                        if match.group(2) or id(text) in fixes
                    ]
    return found


def resolves(dotted: str) -> bool:
    """``converters.register`` -> the object, by getattr from the package (importing submodules on the way)."""
    parts = dotted.split(".")
    obj: object = importlib.import_module(parts[0])
    for depth, part in enumerate(parts[1:], start=2):
        if hasattr(obj, part):
            obj = getattr(obj, part)
            continue
        try:
            obj = importlib.import_module(".".join(parts[:depth]))
        except ImportError:
            return False
    return True


def test_every_api_a_message_suggests_exists() -> None:
    names = suggested_names()
    # the three errors that tell users to write @converters.register('mylib::op'): export, lowering, parser check
    decorators = {file for file, _, name in names if name == "converters.register"}
    assert {"pipeline/exporting/stage.py", "passes/lowering.py", "pipeline/compatibility/static.py"} <= decorators
    assert [(file, line, name) for file, line, name in names if not resolves(name)] == []


def test_the_decorator_line_the_lowering_error_suggests_runs() -> None:
    """The line the error says to write, executed as written, makes the conversion work."""
    import numpy as np

    import converters

    class Shift(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.ops.errtest.shift(x, 2.0)

    @torch.library.custom_op("errtest::shift", mutates_args=())
    def shift(x: torch.Tensor, by: float) -> torch.Tensor:
        return x + by

    shift.register_fake(lambda x, by: torch.empty_like(x))
    with pytest.raises(pipeline.ConversionError) as info:
        pipeline.convert(Shift(), torch.randn(2, 3), backend="onnxruntime")
    line = re.search(r"write: (@converters\.register\(.*?\))$", str(info.value), re.M)
    assert line is not None, str(info.value)
    source = f"{line.group(1)}\ndef convert(ctx):\n    return ctx.op.Add(ctx.inputs[0], np.float32(ctx.attrs['by']))\n"
    exec(source, {"converters": converters, "np": np})  # noqa: S102 - the error's own suggestion
    try:
        module = pipeline.convert(Shift(), torch.randn(2, 3), backend="onnxruntime")
        x = torch.randn(2, 3)
        torch.testing.assert_close(module(x), x + 2.0)
    finally:
        converters.user_registry().remove("errtest::shift")
