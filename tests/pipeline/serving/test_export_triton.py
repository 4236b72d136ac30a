"""`pipeline export-triton`: saved artifacts as a model repository for a GPU Triton, checked by the real server.

Real conversions, saved: an MLP on ONNX Runtime, the same MLP with a TensorRT-RTX engine (built here, not runnable
here), a model TensorRT-RTX runs as segments around ``torch.unique``, and a tiny Llama generation artifact. No NVIDIA
TensorRT installs here, so the ``tensorrt`` artifact is the TensorRT-RTX one relabelled (metadata ``backend`` and
engine record, manifest resealed): what the export does with an NVIDIA TensorRT plan is checked, the plan's bytes
are never loaded. The repository is then moved and the generation artifact's source deleted before the real
``tritonserver`` (Python backend only) loads it: the Python model loads from the copy beside its ``model.py``, the
ONNX and plan models parse and stop at their missing backends; a planted bad field is a config error instead.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import warnings
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime
import pytest
import torch
from google.protobuf import text_format
from tiny_models import tiny_llama

import pipeline
from converters.errors import ArtifactError, InputError
from pipeline.cli.export_triton import add_export_triton_command
from pipeline.precision.buildable import rtx_available
from pipeline.serving.export import TritonExport, export_triton
from pipeline.serving.repository_check import BACKEND_MISSING, CONFIG_ERROR, LOADED, RepositoryCheck, check_repository

model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2", reason="the serve extra is not installed")
pytestmark = [
    pytest.mark.skipif(not rtx_available(), reason="TensorRT-RTX is not installed (the dev extra)"),
    # the TensorRT-RTX engines are built here and cannot run here (tested in test_tensorrt_rtx.py)
    pytest.mark.filterwarnings("ignore::pipeline.runtime.executors.EngineNotRunnableWarning"),
]

DYNAMIC = {"input": {0: ("batch", 1, 4, 16)}}


class Unique(torch.nn.Module):
    """TensorRT-RTX rejects ``Unique``: TensorRT segments with ONNX Runtime between them."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.last = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(self.first(input))
        return self.last(hidden) + torch.unique(torch.round(hidden * 4)).sum()


def relabelled_as_tensorrt(source: Path, target: Path) -> Path:
    """The TensorRT-RTX artifact as if NVIDIA TensorRT had built it (see the module docstring), manifest resealed."""
    with zipfile.ZipFile(source) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    metadata = json.loads(members["metadata.json"])
    metadata["backend"] = metadata["settings"]["backend"] = "tensorrt"
    del metadata["engine"]["tensorrt_rtx"]
    metadata["engine"].update({"tensorrt": "10.13.3", "compute_capability": "8.6"})
    members["metadata.json"] = json.dumps(metadata).encode()
    digests = {name: hashlib.sha256(data).hexdigest() for name, data in members.items() if name != "manifest.json"}
    manifest = {"format": "torch-trt-pipeline-artifact/2", "sha256": digests}
    members["manifest.json"] = json.dumps(manifest).encode()
    with zipfile.ZipFile(target, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return target


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("artifacts")
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).eval()
    sample = torch.randn(2, 8)
    paths = {name: root / f"{name}.ptrt" for name in ("mlp", "rtx", "seg", "llama")}
    pipeline.convert(mlp, sample, dynamic=DYNAMIC).save(paths["mlp"])
    pipeline.convert(mlp, sample, dynamic=DYNAMIC, backend="tensorrt-rtx", trt_engine_cache=False).save(paths["rtx"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the segments' own warnings, tested in tests/pipeline/backends
        segmented = pipeline.convert(
            Unique().eval(), sample, dynamic=DYNAMIC, backend="tensorrt-rtx", min_segment_size=1, trt_engine_cache=False
        )
    segmented.save(paths["seg"])
    ids = torch.tensor([[5, 17, 42, 8, 63, 21]])
    pipeline.convert(tiny_llama(), ids, generation={"max_length": 32, "max_batch": 2}, validate=False).save(
        paths["llama"]
    )
    paths["trt"] = relabelled_as_tensorrt(paths["rtx"], root / "trt.ptrt")
    return paths


@pytest.fixture(scope="module")
def exported(artifacts: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every artifact exported into one repository, which is then moved; the llama was exported from a copy that is
    deleted afterwards."""
    root = tmp_path_factory.mktemp("export")
    gone = root / "gone"
    gone.mkdir()
    llama = shutil.copy(artifacts["llama"], gone / "llama.ptrt")
    exports = {name: export_triton(artifacts[name], root / "first", instances=2) for name in ("mlp", "rtx", "seg")}
    exports["trt"] = export_triton(artifacts["trt"], root / "first")
    exports["llama"] = export_triton(llama, root / "first")
    shutil.rmtree(gone)
    repository = Path(shutil.move(root / "first", root / "moved"))
    return {"repository": repository, "exports": exports}


@pytest.fixture(scope="module")
def checked(exported: dict[str, Any]) -> RepositoryCheck:
    return check_repository(exported["repository"])


def config(directory: Path) -> Any:
    parsed = model_config_pb2.ModelConfig()
    text_format.Parse((directory / "config.pbtxt").read_text(), parsed)
    return parsed


def files(directory: Path) -> set[str]:
    return {str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file()}


def test_the_repository_holds_one_model_per_form_with_its_files(artifacts: dict[str, Path], exported: Any) -> None:
    repository = exported["repository"]
    assert sorted(p.name for p in repository.iterdir()) == [
        "llama",
        "mlp_onnx",
        "rtx_onnx",
        "seg_onnx",
        "trt_onnx",
        "trt_tensorrt",
    ]  # no staging directory left behind, no plan for TensorRT-RTX or segments
    for onnx_model in ("mlp_onnx", "rtx_onnx", "trt_onnx"):
        assert files(repository / onnx_model) == {"config.pbtxt", "1/model.onnx", "1/model.onnx.data"}
    assert files(repository / "trt_tensorrt") == {"config.pbtxt", "1/model.plan"}
    assert files(repository / "llama") == {"config.pbtxt", "1/model.py", "1/llama.ptrt"}
    with zipfile.ZipFile(artifacts["trt"]) as archive:
        assert (repository / "trt_tensorrt/1/model.plan").read_bytes() == archive.read("engine.plan")
    assert (repository / "llama/1/llama.ptrt").read_bytes() == artifacts["llama"].read_bytes()


def test_the_onnx_model_runs_the_graph_with_its_weights_beside_it(artifacts: dict[str, Path], exported: Any) -> None:
    session = onnxruntime.InferenceSession(str(exported["repository"] / "mlp_onnx/1/model.onnx"))
    x = torch.randn(5, 8)
    (got,) = session.run(None, {"input": x.numpy()})
    np.testing.assert_allclose(got, pipeline.load(artifacts["mlp"])(x).numpy(), rtol=1e-5, atol=1e-6)
    seg = onnxruntime.InferenceSession(str(exported["repository"] / "seg_onnx/1/model.onnx"))
    np.testing.assert_allclose(
        seg.run(None, {"input": x.numpy()})[0], pipeline.load(artifacts["seg"])(x).numpy(), rtol=1e-5, atol=1e-5
    )


def test_the_onnx_config_has_dims_batching_instances_and_the_tensorrt_accelerator(exported: Any) -> None:
    parsed = config(exported["repository"] / "mlp_onnx")
    assert (parsed.name, parsed.platform, parsed.max_batch_size) == ("mlp_onnx", "onnxruntime_onnx", 16)
    assert [(t.name, t.data_type, list(t.dims)) for t in parsed.input] == [("input", model_config_pb2.TYPE_FP32, [8])]
    assert [(t.name, t.data_type, list(t.dims)) for t in parsed.output] == [("out", model_config_pb2.TYPE_FP32, [4])]
    assert parsed.dynamic_batching.max_queue_delay_microseconds == 100
    assert [(g.kind, g.count) for g in parsed.instance_group] == [(model_config_pb2.ModelInstanceGroup.KIND_GPU, 2)]
    (accelerator,) = parsed.optimization.execution_accelerators.gpu_execution_accelerator
    assert accelerator.name == "tensorrt"
    assert dict(accelerator.parameters) == {
        "precision_mode": "FP32",
        "trt_profile_min_shapes": "input:1x8",
        "trt_profile_opt_shapes": "input:4x8",
        "trt_profile_max_shapes": "input:16x8",
    }


def test_a_tensorrt_plan_model_uses_the_engines_profile(exported: Any) -> None:
    parsed = config(exported["repository"] / "trt_tensorrt")
    assert (parsed.platform, parsed.max_batch_size) == ("tensorrt_plan", 16)
    assert [list(t.dims) for t in parsed.input] == [[8]] and [list(t.dims) for t in parsed.output] == [[4]]
    (group,) = parsed.instance_group
    assert (group.kind, group.count, list(group.profile)) == (model_config_pb2.ModelInstanceGroup.KIND_GPU, 1, ["0"])
    assert parsed.HasField("dynamic_batching")
    summary = exported["exports"]["trt"].summary()
    assert "profile 0: input 1x8 / 4x8 / 16x8" in summary
    assert "TensorRT 10.13.3" in summary and "compute capability 8.6" in summary
    assert "not exported" not in summary


def test_a_tensorrt_rtx_plan_and_segment_plans_are_not_exported_and_the_summary_says_why(exported: Any) -> None:
    rtx: TritonExport = exported["exports"]["rtx"]
    assert [m.name for m in rtx.models] == ["rtx_onnx"]
    (why,) = rtx.not_exported
    assert "TensorRT-RTX plan" in why and "tensorrt backend runs NVIDIA TensorRT plans only" in why
    assert "not exported:" in rtx.summary() and "TensorRT-RTX" in rtx.summary()
    seg: TritonExport = exported["exports"]["seg"]
    assert [m.name for m in seg.models] == ["seg_onnx"]
    assert "segment plan(s)" in seg.not_exported[0] and "whole ONNX graph is exported" in seg.not_exported[0]


def test_a_generation_artifact_is_a_portable_python_model(exported: Any) -> None:
    directory = exported["repository"] / "llama"
    parsed = config(directory)
    assert (parsed.backend, parsed.max_batch_size, parsed.model_transaction_policy.decoupled) == ("python", 0, True)
    assert [t.name for t in parsed.input] == ["input_ids", "attention_mask"] and parsed.input[1].optional
    assert [t.name for t in parsed.output] == ["tokens"]
    assert {key: value.string_value for key, value in parsed.parameters.items()} == {
        "artifact": "llama.ptrt",
        "threads": "",
        "spinning": "",
    }
    written = (directory / "config.pbtxt").read_text() + (directory / "1/model.py").read_text()
    for machine_path in (sys.prefix, str(Path(pipeline.__file__).parents[1]), "site-packages", "addsitedir"):
        assert machine_path not in written
    assert "pip install torch-trt-pipeline" in exported["exports"]["llama"].summary()


def test_the_real_server_parses_every_config_and_loads_the_python_model(exported: Any, checked: Any) -> None:
    verdicts = {m.name: (m.verdict, m.backend) for m in checked.models}
    assert verdicts == {
        "llama": (LOADED, ""),  # from the moved repository, its source artifact deleted
        "mlp_onnx": (BACKEND_MISSING, "onnxruntime"),
        "rtx_onnx": (BACKEND_MISSING, "onnxruntime"),
        "seg_onnx": (BACKEND_MISSING, "onnxruntime"),
        "trt_onnx": (BACKEND_MISSING, "onnxruntime"),
        "trt_tensorrt": (BACKEND_MISSING, "tensorrt"),
    }
    assert checked.ok
    assert "trt_tensorrt: config parsed; backend 'tensorrt' is not in this server" in checked.summary()
    assert not list(exported["repository"].rglob("__pycache__"))  # the check leaves the repository as it was


def test_a_config_the_server_cannot_parse_is_a_config_error(exported: Any, tmp_path: Path) -> None:
    for name in ("good", "field", "enum"):
        shutil.copytree(exported["repository"] / "mlp_onnx", tmp_path / name)
        text = (tmp_path / name / "config.pbtxt").read_text().replace('"mlp_onnx"', f'"{name}"')
        if name == "field":
            text = text.replace("max_batch_size:", "max_batch_sise:")
        if name == "enum":
            text = text.replace("KIND_GPU", "KIND_TPU")
        (tmp_path / name / "config.pbtxt").write_text(text)
    check = check_repository(tmp_path)
    assert check.verdict("good").verdict == BACKEND_MISSING
    field, enum = check.verdict("field"), check.verdict("enum")
    assert field.verdict == CONFIG_ERROR and 'no field named "max_batch_sise"' in field.reason, field
    assert enum.verdict == CONFIG_ERROR and "KIND_TPU" in enum.reason, enum
    assert not check.ok


def test_existing_models_bad_paths_names_and_batches_are_refused_with_a_fix(
    artifacts: dict[str, Path], tmp_path: Path
) -> None:
    export_triton(artifacts["mlp"], tmp_path / "repo")
    with pytest.raises(InputError, match="(?s)already holds model.*mlp_onnx.*--force"):
        export_triton(artifacts["mlp"], tmp_path / "repo", max_batch=4)
    export_triton(artifacts["mlp"], tmp_path / "repo", max_batch=4, force=True)
    assert config(tmp_path / "repo/mlp_onnx").max_batch_size == 4
    assert sorted(p.name for p in (tmp_path / "repo").iterdir()) == ["mlp_onnx"]
    refusals: list[tuple[dict[str, Any], type[InputError], str]] = [
        (dict(artifact=tmp_path / "missing.ptrt"), InputError, "no artifact at"),
        (dict(name="two words"), InputError, "not a Triton model name"),
        (dict(max_batch=32), InputError, "larger than the batch the model was converted for"),
        (dict(artifact=artifacts["llama"], max_batch=2), InputError, "generation artifact.*does not apply"),
        (dict(repository=tmp_path / "repo/mlp_onnx/config.pbtxt"), InputError, "is a file"),
        (dict(instances=0), InputError, "instances must be >= 1"),
    ]
    for change, error, cause in refusals:
        arguments = {"artifact": artifacts["mlp"], "repository": tmp_path / "other", **change}
        with pytest.raises(error, match=cause) as info:
            export_triton(**arguments)
        assert info.value.fix, cause
    (tmp_path / "junk.ptrt").write_bytes(b"not a zip")
    with pytest.raises(ArtifactError, match="not an artifact"):
        export_triton(tmp_path / "junk.ptrt", tmp_path / "other")
    assert not (tmp_path / "other").exists() or not list((tmp_path / "other").iterdir())


def test_cli_exports_checks_and_prints_the_verdicts(
    artifacts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser(prog="pipeline")
    add_export_triton_command(parser.add_subparsers(required=True))
    repository = tmp_path / "models"
    arguments = [str(artifacts["trt"]), str(repository), "--name", "net", "--instances", "3", "--no-dynamic-batching"]
    args = parser.parse_args(["export-triton", *arguments, "--check", "--json"])
    assert args.run(args) == 0
    printed = json.loads(capsys.readouterr().out)
    assert [(m["name"], m["platform"]) for m in printed["models"]] == [
        ("net_tensorrt", "tensorrt_plan"),
        ("net_onnx", "onnxruntime_onnx"),
    ]
    assert [(m["name"], m["verdict"], m["backend"]) for m in printed["check"]["models"]] == [
        ("net_onnx", BACKEND_MISSING, "onnxruntime"),
        ("net_tensorrt", BACKEND_MISSING, "tensorrt"),
    ]
    parsed = config(repository / "net_tensorrt")
    assert not parsed.HasField("dynamic_batching") and parsed.instance_group[0].count == 3
    args = parser.parse_args(["export-triton", str(artifacts["rtx"]), str(repository)])
    assert args.run(args) == 0
    text = capsys.readouterr().out
    assert "rtx_onnx" in text and "TensorRT-RTX plan" in text and "not verified by the export" in text
