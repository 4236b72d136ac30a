"""Whole models through the pipeline: build each suite model, convert it, classify the outcome.

Used by ``tests/pipeline/test_model_suite.py`` and ``benchmarks/model_coverage.py`` (which puts ``tests/`` on
``sys.path``). The models are the lists of ``tests/model_sources/`` (timm, torchvision, transformers, diffusers):
random weights, a seeded sample at a small input size, nothing downloaded. For one model:

- :func:`run_ours` classifies ``pipeline.convert(model, sample, backend="tensorrt-rtx", precision=...)``: the
  export, the passes, the real TensorRT-RTX parse and build of the final graph, and validation against PyTorch on
  ONNX Runtime (the stand-in for the engine, which cannot run without a GPU);
- :func:`run_plain` classifies plain ``torch.onnx.export(dynamo=True)``, its graph run on ONNX Runtime and compared
  with PyTorch (``PLAIN_TOLERANCE``, absolute and relative), then the same TensorRT-RTX build.

Classes (:data:`STATUSES`): ``ok``; ``pytorch`` when eager PyTorch cannot build or run the model on its sample (not
counted: nothing to convert); one per stage of OUR errors (``input``, ``export``, ``convert``, ``accuracy``,
``parser`` when TensorRT-RTX's parser rejects the final graph, ``build``); ``timeout``; and ``crash``: any other
exception, a bug in the product. Plain export has ``export`` (the exporter's error), ``onnxruntime`` (its graph does
not load or run), ``accuracy`` (it departs from PyTorch), ``parser``, ``build``.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import torch
from model_sources import SOURCES, ModelCase
from opinfo_support import CaseTimeout, Outcome, one_line, time_limit
from torch.utils import _pytree as pytree

import pipeline
from converters.errors import AccuracyError, BuildError, ConversionError, ExportError, InputError, PipelineError
from pipeline.precision.buildable import build_error
from pipeline.validation.attention_paths import SDPA_DISAGREES

STATUSES = (
    "ok",
    "pytorch",
    "input",
    "export",
    "convert",
    "accuracy",
    "parser",
    "build",
    "onnxruntime",
    "timeout",
    "crash",
)
PRECISIONS = ("fp32", "fp16")
PLAIN_TOLERANCE = 1e-3

_OUR_CLASSES: tuple[tuple[type[PipelineError], str], ...] = (
    (InputError, "input"),
    (ExportError, "export"),
    (ConversionError, "convert"),
    (AccuracyError, "accuracy"),
    (BuildError, "build"),
)


def all_cases(sources: tuple[str, ...] = SOURCES) -> dict[str, ModelCase]:
    """Every suite model by :attr:`ModelCase.id`, source by source (each source's list imports its library)."""
    import importlib

    found: dict[str, ModelCase] = {}
    for source in sources:
        module = importlib.import_module(f"model_sources.{source}_models")
        found.update((case.id, case) for case in module.cases())
    return found


def split_sample(sample: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``(args, kwargs)`` of a sample as ``pipeline.convert`` reads it (a tensor, a tuple, or ``(args, kwargs)``)."""
    if isinstance(sample, tuple) and len(sample) == 2 and isinstance(sample[1], dict):
        args = sample[0]
        return (tuple(args) if isinstance(args, (tuple, list)) else (args,)), dict(sample[1])
    return (tuple(sample) if isinstance(sample, (tuple, list)) else (sample,)), {}


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def classify_error(exc: BaseException) -> Outcome:
    """Our errors by stage (a parser rejection apart from other build errors), a timeout, anything else a crash."""
    if isinstance(exc, CaseTimeout):
        return Outcome("timeout", str(exc))
    text = one_line(f"{type(exc).__name__}: {exc}")
    if isinstance(exc, BuildError) and "ONNX parser rejected" in str(exc):
        return Outcome("parser", text)
    if isinstance(exc, AccuracyError) and SDPA_DISAGREES in str(exc):  # no single PyTorch reference to match
        return Outcome("pytorch", text)
    for cls, status in _OUR_CLASSES:
        if isinstance(exc, cls):
            return Outcome(status, text)
    if isinstance(exc, PipelineError):
        return Outcome(exc.stage, text)
    return Outcome("crash", text, False)


def eager(case: ModelCase) -> tuple[torch.nn.Module, Any, Any] | Outcome:
    """``(model, sample, PyTorch's output)``, or the ``pytorch`` outcome when PyTorch cannot build or run it."""
    try:
        with _quiet():
            model, sample = case.build()
            args, kwargs = split_sample(sample)
            with torch.no_grad():
                output = model(*args, **kwargs)
    except Exception as exc:  # the model itself (or our small config of it) does not run: nothing to convert
        return Outcome("pytorch", one_line(f"{type(exc).__name__}: {exc}"))
    return model, sample, output


def run_ours(case: ModelCase, precision: str = "fp32", timeout: float | None = None) -> Outcome:
    """``pipeline.convert`` with TensorRT-RTX (export, passes, the real build, validation on ONNX Runtime)."""
    built = eager(case)
    if isinstance(built, Outcome):
        return built
    model, sample, _ = built
    torch.manual_seed(0)
    try:
        with time_limit(timeout), _quiet():
            module = pipeline.convert(model, sample, backend="tensorrt-rtx", precision=precision)
        segments = getattr(getattr(module, "report", None), "segments", None)
        # ok through the fallback (part of the graph on ONNX Runtime) says so in its reason: the table counts it
        return Outcome("ok", f"segments: {segments.headline()}" if segments else "")
    except Exception as exc:  # classified: our errors by stage, anything else is a crash
        return classify_error(exc)
    except CaseTimeout as exc:
        return classify_error(exc)


def _root_cause(exc: BaseException) -> BaseException:
    seen = {id(exc)}
    while exc.__cause__ is not None and id(exc.__cause__) not in seen:
        exc = exc.__cause__
        seen.add(id(exc))
    return exc


def _tensor_leaves(value: Any) -> list[torch.Tensor]:
    if hasattr(value, "to_tuple"):  # transformers' ModelOutput and diffusers' BaseOutput: their set fields, in order
        value = value.to_tuple()
    return [leaf for leaf in pytree.tree_leaves(value) if isinstance(leaf, torch.Tensor)]


def plain_mismatch(graph: onnx.ModelProto, sample: Any, expected: Any) -> Outcome | None:
    """None when plain export's graph, run on ONNX Runtime, matches PyTorch's ``expected`` outputs within
    ``PLAIN_TOLERANCE``; else the ``onnxruntime`` or ``accuracy`` outcome."""
    import onnxruntime as ort

    args, kwargs = split_sample(sample)
    feeds = [t.numpy() for t in _tensor_leaves((args, kwargs))]
    try:
        session = ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]
        got = session.run(None, dict(zip(names, feeds[: len(names)], strict=True)))
    except Exception as exc:  # ONNX Runtime's own errors on the exporter's graph
        return Outcome("onnxruntime", one_line(f"{type(exc).__name__}: {exc}"))
    want = [t.detach().numpy() for t in _tensor_leaves(expected)]
    if len(got) != len(want):
        return Outcome("accuracy", f"{len(got)} outputs where PyTorch returns {len(want)}")
    for index, (a, b) in enumerate(zip(got, want, strict=True)):
        if a.shape != b.shape or not np.allclose(a, b, atol=PLAIN_TOLERANCE, rtol=PLAIN_TOLERANCE, equal_nan=True):
            worst = float(np.max(np.abs(a.astype(np.float64) - b))) if a.shape == b.shape else float("nan")
            return Outcome("accuracy", f"output {index}: max abs error {worst:.3g} (shape {a.shape} vs {b.shape})")
    return None


def run_plain(case: ModelCase, timeout: float | None = None) -> Outcome:
    """Plain ``torch.onnx.export(dynamo=True)``, ONNX Runtime against PyTorch, then the TensorRT-RTX build."""
    built = eager(case)
    if isinstance(built, Outcome):
        return built
    model, sample, expected = built
    args, kwargs = split_sample(sample)
    try:
        with time_limit(timeout), _quiet(), contextlib.redirect_stdout(None):
            try:
                program = torch.onnx.export(model, args, kwargs=kwargs, dynamo=True, verbose=False)
            except Exception as exc:  # the exporter's own errors: keep the innermost reason
                root = _root_cause(exc)
                return Outcome("export", one_line(f"{type(root).__name__}: {root}"))
            assert program is not None
            graph = program.model_proto
            mismatch = plain_mismatch(graph, sample, expected)
            if mismatch is not None:
                return mismatch
            error = build_error(graph)
        if error is None:
            return Outcome("ok")
        return Outcome("parser" if error.startswith("parse:") else "build", one_line("TensorRT-RTX " + error))
    except Exception as exc:  # a raw error of the build step
        return Outcome("crash", one_line(f"{type(exc).__name__}: {exc}"), False)
    except CaseTimeout as exc:
        return classify_error(exc)


@dataclass(frozen=True)
class ModelResult:
    """One model's row: ours in fp32 and fp16 and plain export, with the seconds each took."""

    case: ModelCase
    outcomes: dict[str, Outcome]
    seconds: dict[str, float]


def warm_up(case: ModelCase, timeout: float | None = None) -> None:
    """Pay a process's first-use costs before any side is timed, so that no side pays them for the others: the
    libraries (ONNX Runtime, the exporter's registry, TensorRT-RTX's builder: a small Linear model through plain
    export and the build) and ``case``'s own first export (``torch.export``'s per-op caches, the translation of
    each op: the first side to export transformers' BERT took 14.4 s where the same conversion took 3.9 s next
    time)."""

    def tiny() -> tuple[torch.nn.Module, torch.Tensor]:
        return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval(), torch.randn(2, 8)

    run_plain(ModelCase("warm-up", "linear", "none", tiny), timeout)
    built = eager(case)
    if isinstance(built, Outcome):
        return
    model, sample, _ = built
    args, kwargs = split_sample(sample)
    try:
        with time_limit(timeout), _quiet(), contextlib.redirect_stdout(None):
            torch.onnx.export(model, args, kwargs=kwargs, dynamo=True, verbose=False)
    except (Exception, CaseTimeout):  # the sides report the model's own export failure; warming is best effort
        pass


def run_case(case: ModelCase, sides: tuple[str, ...] = ("fp32", "fp16", "plain"), timeout: float = 300) -> ModelResult:
    """The coverage row of one model: each of ``sides`` (``fp32``, ``fp16``: ours; ``plain``) under ``timeout``."""
    outcomes, seconds = {}, {}
    for side in sides:
        start = time.perf_counter()
        outcomes[side] = run_plain(case, timeout) if side == "plain" else run_ours(case, side, timeout)
        seconds[side] = time.perf_counter() - start
    return ModelResult(case, outcomes, seconds)
