"""``pipeline export-triton``: one saved artifact as a model repository for a GPU Triton Inference Server.

What the artifact holds decides the models (each ``REPO/MODEL/config.pbtxt`` and ``REPO/MODEL/1/...``):

- an NVIDIA TensorRT engine (``engine.plan``, backend ``tensorrt``): ``NAME_tensorrt``, a ``tensorrt_plan`` model
  (``1/model.plan``) whose instances use the engine's optimization profiles;
- the final ONNX graph, always (but for a generation artifact): ``NAME_onnx``, an ``onnxruntime_onnx`` model
  (``1/model.onnx``, its weights in ``1/model.onnx.data``) with ONNX Runtime's TensorRT execution accelerator;
- a generation artifact (a decoder-only step, or the directory of an encoder-decoder, a vision-language model or a
  model whose text cross-attends to its images):
  ``NAME``, a Python-backend model that loads the artifact (copied to ``NAME/1/``) with :func:`pipeline.load` and
  streams tokens (:mod:`pipeline.serving.repository`).

Not exported, and said so in :meth:`TritonExport.summary`: a TensorRT-RTX plan (Triton's ``tensorrt`` backend runs
NVIDIA TensorRT plans, not TensorRT-RTX ones), the segment plans of a segmented artifact, and a weight-stripped or
stale plan (the graph holds its weights; Triton does not refit). Each model directory is written under a staging
name and renamed into place, so an interrupted export leaves no half-written model. What can be checked on this
machine is in :mod:`pipeline.serving.repository_check`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from converters.errors import InputError
from converters.files import write_file_atomically
from passes.model_io.external_data import save_onnx
from pipeline.runtime.artifact import Artifact, settings_from_json
from pipeline.runtime.artifact_reading import read_artifact, read_metadata
from pipeline.runtime.tensorrt.profiles import ProfileShapes, profile_shapes, profiles_shapes
from pipeline.serving.model_config import batch_axis, check_max_batch, model_config, write_config
from pipeline.serving.repository import NAME, ServedArtifact, served_artifact, write_serving_model
from pipeline.settings import Settings

TENSORRT_PLAN = "tensorrt_plan"
ONNXRUNTIME_ONNX = "onnxruntime_onnx"
PYTHON = "python"
#: ONNX Runtime's TensorRT provider builds with these flags (Triton's ``precision_mode``); the graph already computes
#: in the converted precision, the flag lets TensorRT pick kernels of that precision
PRECISION_MODES = {"fp32": "FP32", "fp16": "FP16", "bf16": "BF16", "int8": "INT8"}
INSTALL_HINT = "pip install torch-trt-pipeline"
#: node domains ONNX Runtime runs without a custom-op library
ORT_DOMAINS = ("", "ai.onnx", "com.microsoft")


@dataclass(frozen=True)
class ExportedModel:
    """One model of the repository: its name, Triton platform (or backend), directory, files and what it was given."""

    name: str
    platform: str
    directory: Path
    files: tuple[str, ...]
    max_batch: int
    details: tuple[str, ...] = ()


@dataclass(frozen=True)
class TritonExport:
    """What :func:`export_triton` wrote, what it left out and why, and what the serving machine needs."""

    artifact: Path
    backend: str
    repository: Path
    models: tuple[ExportedModel, ...]
    not_exported: tuple[str, ...]
    server_needs: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """The export as JSON-ready data."""
        return {
            "artifact": str(self.artifact),
            "backend": self.backend,
            "repository": str(self.repository),
            "models": [
                {"name": m.name, "platform": m.platform, "files": list(m.files), "max_batch": m.max_batch}
                for m in self.models
            ],
            "not_exported": list(self.not_exported),
            "server_needs": list(self.server_needs),
        }

    def summary(self) -> str:
        """The export as text (what ``pipeline export-triton`` prints)."""
        lines = [f"exported {self.artifact.name} (backend {self.backend}) to {self.repository}"]
        for model in self.models:
            files = ", ".join(f"1/{name}" for name in model.files)
            lines.append(f"  {model.name:<24} {model.platform:<17} {files}")
            lines += [f"  {'':<24} {detail}" for detail in model.details]
        if self.not_exported:
            lines.append("not exported:")
            lines += [f"  - {note}" for note in self.not_exported]
        lines.append("the serving machine needs:")
        lines += [f"  - {need}" for need in self.server_needs]
        lines.append(
            "not verified by the export: that Triton's onnxruntime and tensorrt backends load these models on a GPU "
            "(the model files against the dims, the profiles, the plan against the server's TensorRT); `--check` "
            "runs nvidia-pytriton's tritonserver (Python backend only): every config.pbtxt parsed, backends named"
        )
        return "\n".join(lines)


def export_triton(
    artifact: str | Path,
    repository: str | Path,
    *,
    name: str | None = None,
    max_batch: int | None = None,
    max_queue_delay_us: int = 100,
    dynamic_batching: bool = True,
    instances: int = 1,
    force: bool = False,
) -> TritonExport:
    """Write the models of ``artifact`` into the Triton model repository ``repository``; what was written.

    ``name`` (default: the artifact's stem; its directory's name for ``model.ptrt``) prefixes the model names.
    ``max_batch`` is Triton's ``max_batch_size``
    (default: the batch dimension's declared maximum; 0 when the graph has none, each request one whole call);
    ``max_queue_delay_us`` the dynamic batcher's delay (``dynamic_batching=False``: no dynamic batcher);
    ``instances`` the instances per GPU. An existing model directory is an error unless ``force`` (then replaced).
    A generation artifact is one decoupled Python-backend model (``max_batch`` does not apply).

    >>> export = export_triton("resnet.ptrt", "models", max_batch=8)   # doctest: +SKIP
    >>> print(export.summary())                                       # doctest: +SKIP
    """
    served = served_artifact(artifact, name)
    if instances < 1:
        raise InputError(f"export-triton: instances must be >= 1, not {instances}", fix="pass --instances 1 or more")
    repository = Path(repository)
    if repository.exists() and not repository.is_dir():
        raise InputError(f"export-triton: {repository} is a file", fix="give a directory (created if missing)")
    metadata = read_metadata(served.metadata_file)
    settings = settings_from_json(metadata["settings"])
    delay = max_queue_delay_us if dynamic_batching else None
    if served.generative:
        if max_batch:
            raise InputError(
                f"export-triton: {served.name!r} is a generation artifact, served decoupled with each request a "
                f"prompt (its rows up to the converted max_batch): max_batch {max_batch} does not apply",
                fix="leave --max-batch out for a generation artifact",
            )
        names = [served.name]
    else:
        axis = batch_axis(served.io, served.dynamic)
        batch = (axis.max if axis else 0) if max_batch is None else max_batch
        check_max_batch(served.name, axis, batch)
        with_plan, plan_note = _plan_export(metadata)
        names = [*([f"{served.name}_tensorrt"] if with_plan else []), f"{served.name}_onnx"]
    _check_names(repository, names, force)
    with _staged_models(repository) as staging:
        if served.generative:
            models = [_python_model(staging, served, instances)]
            not_exported: list[str] = []
            extra = f"; its {metadata['backend']} extra for the engine" if metadata.get("engine") else ""
            needs = [
                f"the Triton Python backend's interpreter with the package installed ({INSTALL_HINT}{extra}): "
                "model.py loads the artifact beside it with pipeline.load"
            ]
        else:
            graph = read_artifact(served.path)  # its weights' directory lives as long as `graph`
            plan = [_plan_model(staging, served, graph, settings, batch, delay, instances)] if with_plan else []
            models = [*plan, _onnx_model(staging, served, graph, settings, batch, delay, instances)]
            not_exported = [plan_note] if plan_note else []
            needs = _server_needs(metadata, graph, bool(plan))
    return TritonExport(
        served.path,
        str(metadata["backend"]),
        repository,
        tuple(dataclasses.replace(m, directory=repository / m.name) for m in models),
        tuple(not_exported),
        tuple(needs),
    )


def _plan_export(metadata: dict[str, Any]) -> tuple[bool, str | None]:
    """Whether the artifact's engine becomes a ``tensorrt_plan`` model, and if it holds one that does not, why."""
    engine = metadata.get("engine")
    if not engine:
        return False, None
    if metadata.get("segments"):
        count = sum(1 for segment in metadata["segments"] if segment.get("kind") == "tensorrt")
        return False, (
            f"the {count} segment plan(s) (engine-segment-<i>.plan): the artifact runs TensorRT segments with ONNX "
            "Runtime between them, which no single Triton model does; the whole ONNX graph is exported instead"
        )
    if metadata["backend"] == "tensorrt-rtx":
        return False, (
            "the engine: it is a TensorRT-RTX plan, and Triton's tensorrt backend runs NVIDIA TensorRT plans only; "
            "the ONNX graph is exported instead (ONNX Runtime's TensorRT provider builds an engine at load)"
        )
    if engine.get("weights") == "graph" or engine.get("refit_at_load"):
        return False, (
            "the engine: its plan lacks the current weights (weight-stripped or refit at load), and Triton loads "
            "plans as they are; the ONNX graph is exported"
        )
    return True, None


def _check_names(repository: Path, names: list[str], force: bool) -> None:
    for model in names:
        if not NAME.match(model) or model.startswith("."):
            raise InputError(
                f"export-triton: {model!r} is not a Triton model name (letters, digits, '_', '.', '-')",
                fix="pass --name with such a name",
            )
    taken = [model for model in names if (repository / model).exists()]
    if taken and not force:
        raise InputError(
            f"export-triton: {repository} already holds model(s) {', '.join(taken)}",
            fix="pass --force to replace them, --name for other names, or another repository",
        )
    blocked = [model for model in taken if not (repository / model).is_dir()]
    if blocked:
        raise InputError(
            f"export-triton: {repository} holds file(s) named {', '.join(blocked)} where a model directory goes",
            fix="remove them or choose another --name",
        )


@contextlib.contextmanager
def _staged_models(repository: Path) -> Iterator[Path]:
    """A staging directory beside the models; each model directory in it replaces its namesake when the block ends
    (a crash leaves the repository's models as they were, and at most a hidden staging directory)."""
    try:
        repository.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".export-triton.", dir=repository))
    except OSError as exc:
        raise InputError(
            f"export-triton: cannot write to {repository}: {exc.strerror or exc}", fix="choose a writable directory"
        ) from exc
    try:
        yield staging
        for model in sorted(staging.iterdir()):
            target = repository / model.name
            if target.exists():
                old = staging / f".replaced.{model.name}"
                os.replace(target, old)
            os.chmod(model, 0o755)
            os.replace(model, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _python_model(staging: Path, served: ServedArtifact, instances: int) -> ExportedModel:
    directory = write_serving_model(
        staging, served, max_batch=0, queue_delay_us=None, instances=instances, threads=None, portable=True
    )
    return ExportedModel(
        served.name,
        PYTHON,
        directory,
        ("model.py", served.path.name),
        0,
        ("decoupled: one response per token; the generate options are request parameters",),
    )


def _gpu_config(
    name: str, served: ServedArtifact, platform: str, max_batch: int, delay: int | None, instances: int
) -> Any:
    """The configuration of a model of the graph on ``platform``, its instances on the GPUs."""
    return model_config(
        name,
        served.io,
        platform=platform,
        max_batch=max_batch,
        queue_delay_us=delay,
        instances=instances,
        kind="KIND_GPU",
    )


def _plan_model(
    staging: Path,
    served: ServedArtifact,
    graph: Artifact,
    settings: Settings,
    max_batch: int,
    delay: int | None,
    instances: int,
) -> ExportedModel:
    name = f"{served.name}_tensorrt"
    config = _gpu_config(name, served, TENSORRT_PLAN, max_batch, delay, instances)
    profiles = profiles_shapes(served.io, settings) if settings.dynamic else []
    # each instance may run any of the engine's profiles: Triton picks the one that holds a request's shapes
    config.instance_group[0].profile.extend(str(index) for index in range(len(profiles)))
    directory = staging / name
    assert graph.engine is not None
    write_file_atomically(directory / "1" / "model.plan", graph.engine)
    write_config(config, directory)
    details = [_batching(max_batch, delay, instances)]
    details += [f"profile {index}: {_profile_text(shapes)}" for index, shapes in enumerate(profiles)]
    return ExportedModel(name, TENSORRT_PLAN, directory, ("model.plan",), max_batch, tuple(details))


def _onnx_model(
    staging: Path,
    served: ServedArtifact,
    graph: Artifact,
    settings: Settings,
    max_batch: int,
    delay: int | None,
    instances: int,
) -> ExportedModel:
    name = f"{served.name}_onnx"
    config = _gpu_config(name, served, ONNXRUNTIME_ONNX, max_batch, delay, instances)
    accelerator = config.optimization.execution_accelerators.gpu_execution_accelerator.add(name="tensorrt")
    precision = PRECISION_MODES.get(settings.precision, "FP32")
    accelerator.parameters["precision_mode"] = precision
    if settings.trt_workspace_bytes:
        accelerator.parameters["max_workspace_size_bytes"] = str(settings.trt_workspace_bytes)
    shapes = _declared_profile(served, settings)
    for which, position in (("min", 0), ("opt", 1), ("max", 2)):
        if shapes:
            accelerator.parameters[f"trt_profile_{which}_shapes"] = ",".join(
                f"{tensor}:{'x'.join(map(str, ranges[position]))}" for tensor, ranges in shapes.items()
            )
    directory = staging / name
    written = save_onnx(graph.onnx_model, directory / "1" / "model.onnx")
    write_config(config, directory)
    details = [_batching(max_batch, delay, instances), f"TensorRT accelerator: {precision}"]
    if precision != "FP32":
        details[-1] += (
            " (ONNX Runtime builds weakly typed: TensorRT may also lower layers the conversion kept in fp32; the "
            "accuracy the conversion measured is not this engine's)"
        )
    if shapes:
        details.append(f"TensorRT profile: {_profile_text(shapes)}")
    return ExportedModel(name, ONNXRUNTIME_ONNX, directory, tuple(p.name for p in written), max_batch, tuple(details))


def _declared_profile(served: ServedArtifact, settings: Settings) -> ProfileShapes:
    """One profile over the declared dynamic ranges (those of every profile together); empty when an input has a
    symbolic dimension that was not declared (ONNX Runtime then profiles the shapes it meets)."""
    try:
        return profile_shapes(served.io, dataclasses.replace(settings, profiles=()))
    except ValueError:
        return {}


def _profile_text(shapes: ProfileShapes) -> str:
    return ", ".join(
        f"{tensor} {' / '.join('x'.join(map(str, shape)) for shape in ranges)}" for tensor, ranges in shapes.items()
    )


def _batching(max_batch: int, delay: int | None, instances: int) -> str:
    batching = "no batch dimension" if max_batch == 0 else f"max_batch_size {max_batch}"
    if max_batch and delay is not None:
        batching += f", dynamic batching ({delay} us)"
    return f"{batching}; {instances} instance(s) per GPU"


def _server_needs(metadata: dict[str, Any], graph: Artifact, plan: bool) -> list[str]:
    needs = []
    if plan:
        engine = metadata.get("engine") or {}
        version = engine.get("tensorrt", "the build's")
        capability = engine.get("compute_capability", "the build's")
        needs.append(
            f"for the plan: Triton's tensorrt backend with TensorRT {version} (the tritonserver image of that TensorRT "
            f"release) on a GPU of compute capability {capability} (unless built version- or hardware-compatible)"
        )
        if (engine.get("build") or {}).get("trt_version_compatible"):
            needs.append(
                "the plan is version-compatible: start tritonserver with "
                "--backend-config=tensorrt,version-compatible=true"
            )
        if metadata.get("plugins"):
            needs.append(
                "the plan has plugin layers: their library, given to tritonserver with "
                "--backend-config=tensorrt,plugins=/path/to/libplugins.so"
            )
    needs.append(
        "for the ONNX model: Triton's onnxruntime backend with its TensorRT execution provider (built with "
        "TRITON_ENABLE_ONNXRUNTIME_TENSORRT); the provider builds an engine per instance at load"
    )
    custom = sorted({f"{n.domain}::{n.op_type}" for n in graph.onnx_model.graph.node if n.domain not in ORT_DOMAINS})
    if custom:
        needs.append(
            f"the graph holds custom-domain nodes ({', '.join(custom)}): ONNX Runtime runs them only with their "
            "custom-op library (config model_operations { op_library_filename }), which is not exported"
        )
    return needs
