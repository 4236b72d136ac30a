"""Stage: validation. Polygraphy's Comparator runs PyTorch (our runner) and the backend on the same inputs.

Inputs are the sample plus ``settings.validation_inputs`` random inputs drawn like it (seeded) by
:func:`pipeline.validation.draws.draw_like`: floats from a normal with the sample's mean and spread, integers uniformly
within its range, keeping what the sample tensor shows the model may require (masks keep their pattern; values in
[0, 1], positive or non-negative values, sorted last axes, symmetric positive-definite matrices and offsets stay
so). With dynamic dimensions, one more input at every dimension's ``min`` and one at its ``max`` (a generation
step: one input per named dimension at its ``max``).

A drawn input that PyTorch itself still refuses is dropped, with a WARNING and in the report
(:attr:`AccuracyReport.dropped`): validation goes on with the others. The sample refused is an InputError.
Outputs that depend on random nodes are judged by distribution (:mod:`pipeline.accuracy.distribution`), outputs
that are uninitialised memory by shape and dtype (:mod:`pipeline.accuracy.uninitialised`).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import onnx
import torch
import torch.utils._pytree as pytree
from polygraphy.backend.base import BaseRunner
from polygraphy.logger import G_LOGGER

from converters.errors import AccuracyError, BuildError, InputError, PipelineError
from pipeline.accuracy.anchoring import Anchoring
from pipeline.accuracy.distribution import DistributionStats, measure_torch_spread
from pipeline.accuracy.stats import (
    ALL_NAN_NOTE,
    RULE,
    ErrorAccumulator,
    ErrorStats,
    Judgement,
    judgement,
    output_accumulators,
)
from pipeline.accuracy.uninitialised import RULE as UNINITIALISED_RULE
from pipeline.accuracy.uninitialised import ShapeStats
from pipeline.runtime.io_spec import IOSpec
from pipeline.runtime.reports.accuracy import AccuracyReport, OutputAccuracy
from pipeline.settings import DEFAULT_TOLERANCES, DynamicDim, Settings
from pipeline.validation.attention_paths import skipped_causal_mask
from pipeline.validation.draws import draw_like, properties
from pipeline.validation.errors import output_origins, raise_accuracy_error
from pipeline.validation.screening import ScreenedFeeds, torch_function

logger = logging.getLogger(__name__)

Feed = dict[str, np.ndarray]


class TorchRunner(BaseRunner):
    """Runs the original PyTorch model on a Polygraphy feed (``{input name: array}``) on the CPU or the model's
    device. Polygraphy's own PytRunner cannot be used: it moves every input to CUDA unconditionally."""

    def __init__(self, model: torch.nn.Module, io: IOSpec, name: str = "torch") -> None:
        super().__init__(name=name)
        self.model = model
        self.io = io
        self.device = next((p.device for p in model.parameters()), torch.device("cpu"))

    def get_input_metadata_impl(self) -> Any:
        """Polygraphy's view of the model's inputs: name, torch dtype and shape from the I/O spec."""
        from polygraphy.common import TensorMetadata

        meta = TensorMetadata()
        for t in self.io.inputs:
            meta.add(t.name, t.torch_dtype, t.shape)
        return meta

    def infer_impl(self, feed_dict: Feed) -> dict[str, np.ndarray]:
        """Call the model on one feed (rebuilt into its Python call) and return its tensor outputs by name."""
        try:
            return self.call(feed_dict)
        except Exception as error:  # PyTorch itself refuses a drawn input: say so, never a raw error
            raise InputError(
                f"PyTorch itself raised{_raised_in(error)} on a validation input drawn like the sample: "
                f"{type(error).__name__}: {' '.join(str(error).split())[:300]}",
                fix="the model accepts only some inputs (a positive-definite matrix, values in [0, 1], ...): "
                "validation_inputs=0 validates on the sample only; or give a sample whose drawn neighbours it takes",
            ) from error

    def call(self, feed_dict: Feed) -> dict[str, np.ndarray]:
        """The model's outputs on one feed, by name; whatever PyTorch raises is raised as it is."""
        feed = {k: tensor_from_array(v).to(self.device) for k, v in feed_dict.items()}
        args, kwargs = self.io.feed_to_call(feed)
        start = time.perf_counter()
        with torch.no_grad():
            result = self.model(*args, **kwargs)
        self.inference_time = time.perf_counter() - start
        tensors = [leaf for leaf in pytree.tree_leaves(result) if isinstance(leaf, torch.Tensor)]
        return {spec.name: _output_array(t) for spec, t in zip(self.io.outputs, tensors, strict=True)}


def _output_array(tensor: torch.Tensor) -> np.ndarray:
    """A model output as numpy: bfloat16 (which numpy has no type for) widened to float32, exactly."""
    tensor = tensor.detach().cpu()
    return (tensor.float() if tensor.dtype == torch.bfloat16 else tensor).numpy()


def _raised_in(error: BaseException) -> str:
    """The text `` in torch function 'name'`` for the innermost frame of torch's Python code that raised, or ""."""
    name = torch_function(error)
    return f" in torch function {name!r}" if name else ""


def tensor_from_array(array: np.ndarray) -> torch.Tensor:
    """A CPU tensor of ``array``'s shape, 0-d included (``np.ascontiguousarray`` would make a 0-d array 1-d)."""
    return torch.from_numpy(np.asarray(array, order="C"))


def validation_feeds(io: IOSpec, sample_inputs: list[torch.Tensor], settings: Settings) -> list[Feed]:
    """The sample, then seeded random inputs drawn like it, then (if dynamic) all-min and all-max shapes; a generation
    step's max is one input per named dimension instead (:func:`_largest`)."""
    rng = np.random.default_rng(settings.seed)
    sample = [t.detach().cpu().numpy() for t in sample_inputs]
    feeds: list[Feed] = [{spec.name: arr for spec, arr in zip(io.inputs, sample, strict=True)}]
    shapes = [list(a.shape) for a in sample]
    shape_sets = [shapes] * settings.validation_inputs
    names = [spec.name for spec in io.inputs]
    corners = [(tuple(settings.dynamic), "min"), *((group, "max") for group in _largest(settings))]
    for dims, which in corners if settings.dynamic else []:
        resized = [list(s) for s in shapes]
        for d in dims:
            resized[names.index(d.input)][d.axis] = getattr(d, which)
        shape_sets = [*shape_sets, resized]
    kept = [properties(arr) for arr in sample]  # detected once per input, kept by every draw
    for shape_set in shape_sets:
        feeds.append(
            {
                spec.name: draw_like(arr, tuple(shape), rng, found)
                for spec, arr, shape, found in zip(io.inputs, sample, shape_set, kept, strict=True)
            }
        )
    return feeds


def _largest(settings: Settings) -> list[tuple[DynamicDim, ...]]:
    """The groups of dynamic dimensions set to their max together: all of them, the engine profile's largest shape;
    for a generation step (``settings.generation``), each named dimension alone, the others at the sample's size. A
    step's largest shape is ``max_batch`` prompts of ``max_prompt`` tokens (by default a whole cache each: 4 x 2048
    tokens through PyTorch and the backend at ``max_length`` 2048, the costliest input by far), where one prompt of
    ``max_prompt`` tokens and ``max_batch`` rows of the sample's length reach each dimension's extreme. Validation's
    decodings against ``model.generate`` take a batch of long prompts together
    (:mod:`pipeline.generation.validation`)."""
    if not settings.dynamic:
        return []
    if settings.generation is None:
        return [tuple(settings.dynamic)]
    named = dict.fromkeys(d.name for d in settings.dynamic)
    return [tuple(d for d in settings.dynamic if d.name == name) for name in named]


def as_io_types(feeds: list[Feed], io: IOSpec) -> list[Feed]:
    """``feeds`` with each float input in the type ``io`` gives it (float32 -> float16 with precision_io="low")."""
    dtypes = {t.name: t.dtype for t in io.inputs}
    return [{name: _as_type(value, dtypes.get(name)) for name, value in feed.items()} for feed in feeds]


def _as_type(value: np.ndarray, dtype: str | None) -> np.ndarray:
    if dtype is None or value.dtype == np.dtype(dtype) or not np.issubdtype(value.dtype, np.floating):
        return value
    return value.astype(dtype)


def validate(
    model: torch.nn.Module,
    io: IOSpec,
    backend_runner: Any,
    feeds: list[Feed],
    settings: Settings,
    backend_io: IOSpec | None = None,
    graph: onnx.ModelProto | None = None,
    given: int = 1,
) -> AccuracyReport:
    """Compare the backend with PyTorch on ``feeds``; raise AccuracyError when an output is out of tolerance.

    ``io`` is the model's; ``backend_io`` the backend's when its types differ (``precision_io="low"``): ``feeds``
    are then in the backend's types, PyTorch gets the same values in the model's (Polygraphy casts each feed to a
    runner's input metadata), and half outputs are compared as float32. Each output is judged by
    :func:`pipeline.accuracy.stats.judgement` (the tolerance of the type the graph computes it in); outputs that
    depend on random nodes of ``graph`` (the graph the backend runs) by their distribution; outputs ``graph``
    records as uninitialised memory by shape and dtype. The first ``given`` feeds are the user's (the sample):
    PyTorch refusing one is an InputError; a drawn feed it refuses is dropped, logged as a WARNING and listed in
    the report's ``dropped``."""
    from polygraphy.comparator import Comparator

    _check_tolerance_keys(settings, io, model)
    outputs = io.outputs
    if backend_io is not None and backend_io != io:
        backend_runner = _FloatOutputs(backend_runner)
        outputs = backend_io.outputs  # the backend's output dtypes pick the tolerance
    judged = {o.name: judgement(o.name, o.dtype, settings) for o in outputs}
    accumulators = output_accumulators(graph, {o.name: judged[o.name].tolerance for o in outputs})
    elementwise = {n: j for n, j in judged.items() if isinstance(accumulators[n], ErrorAccumulator)}
    anchoring = Anchoring(model, io, elementwise)
    torch_runner = ScreeningTorchRunner(model, io)
    loader = ScreenedFeeds(feeds, torch_runner, given)
    actual: dict[str, Any] = {}
    compared: list[Feed] = []  # the feeds compared, in order (a random output's yardstick draws PyTorch on them)
    with polygraphy_quiet(), _backend_errors(backend_runner):
        for single in Comparator.run([torch_runner, backend_runner], data_loader=loader, streaming=True):
            (_, expected), (_, actual) = [(name, iterations[0]) for name, iterations in single.items()]
            missing = [o.name for o in outputs if o.name not in actual]
            if missing:
                raise AccuracyError(
                    f"output {missing[0]!r} is missing from the backend's results",
                    fix="a pass renamed or removed a graph output; graph outputs must be kept",
                )
            compared.append(torch_runner.last_feed)
            anchored = anchoring.tolerances(torch_runner.last_feed, actual, expected)
            for o in outputs:
                accumulator_ = accumulators[o.name]
                if o.name in anchored and isinstance(accumulator_, ErrorAccumulator):
                    accumulator_.add(np.asarray(actual[o.name]), np.asarray(expected[o.name]), anchored[o.name])
                else:
                    accumulator_.add(np.asarray(actual[o.name]), np.asarray(expected[o.name]))
    anchoring.log_cost()
    measure_torch_spread(accumulators.items(), torch_runner.call, compared)
    results = {o.name: accumulators[o.name].result() for o in outputs}
    shape_only = any(isinstance(r, ShapeStats) for r in results.values())
    report = AccuracyReport(
        len(feeds) - len(loader.dropped),
        tuple(_summarise(o, judged[o.name], results[o.name], anchoring.note(o.name)) for o in outputs),
        rule=f"{RULE}; {UNINITIALISED_RULE}" if shape_only else RULE,
        dropped=tuple(loader.dropped),
    )
    if not report.inputs:  # possible only when no input is the user's: never a pass on nothing
        raise InputError(
            f"PyTorch itself refused every one of the {len(feeds)} validation inputs: "
            + "; ".join(d.summary() for d in report.dropped),
            fix="give a sample the model takes (it is always validated on), or convert with validate=False",
        )
    if not report.passed:
        failed = frozenset(o.name for o in report.outputs if not o.passed)
        cause = skipped_causal_mask(model, torch_runner.call, torch_runner.last_feed, actual, failed)
        raise_accuracy_error(report, output_origins(graph) if graph is not None else {}, cause)
    return report


class ScreeningTorchRunner(TorchRunner):
    """A TorchRunner whose outputs for the next feed may be computed ahead (by :class:`ScreenedFeeds`, to learn
    whether PyTorch takes the feed): the Comparator's call then returns them instead of running the model again."""

    def __init__(self, model: torch.nn.Module, io: IOSpec) -> None:
        super().__init__(model, io)
        self.ready: dict[str, np.ndarray] | None = None
        self.last_feed: Feed = {}  # the feed of the latest comparison (the anchored rule runs PyTorch on it again)

    def infer_impl(self, feed_dict: Feed) -> dict[str, np.ndarray]:
        """The outputs computed ahead for this feed, else the model's on it."""
        self.last_feed = feed_dict
        ready, self.ready = self.ready, None
        return ready if ready is not None else super().infer_impl(feed_dict)


@contextlib.contextmanager
def _backend_errors(runner: Any) -> Iterator[None]:
    """A backend that fails to run the converted graph on a validation input raises BuildError, never a raw error."""
    try:
        yield
    except PipelineError:
        raise
    except Exception as error:
        name = getattr(runner, "name", type(runner).__name__)
        raise BuildError(
            f"the backend ({name}) failed to run the converted graph on a validation input: "
            f"{type(error).__name__}: {' '.join(str(error).split())[:400]}",
            fix="the node named in the message is where it failed: inspect module.onnx there (pipeline inspect, or "
            "convert with validate=False and run module.onnx yourself); please report it with the model",
        ) from error


def _check_tolerance_keys(settings: Settings, io: IOSpec, model: torch.nn.Module) -> None:
    """A tolerance for an output the graph does not have would be silently ignored: say so instead. (A module path
    is a key too: the per-layer comparison's tolerance for that module's outputs.)"""
    outputs = [o.name for o in io.outputs]
    known = {*outputs, *DEFAULT_TOLERANCES, *(name for name, _ in model.named_modules() if name)}
    unknown = sorted(k for k in settings.tolerances if k not in known)
    if unknown:
        raise InputError(
            f"tolerances name {', '.join(map(repr, unknown))}, which is neither an output, a dtype nor a module of "
            "the model",
            fix=f"the outputs are: {', '.join(outputs)}; the dtypes: {', '.join(DEFAULT_TOLERANCES)}",
        )


class _FloatOutputs(BaseRunner):
    """A backend runner whose float16 outputs come back as float32, to be compared with PyTorch's float32."""

    def __init__(self, runner: BaseRunner) -> None:
        super().__init__(name=runner.name)
        self.runner = runner

    def activate_impl(self) -> None:
        self.runner.activate()

    def deactivate_impl(self) -> None:
        self.runner.deactivate()

    def get_input_metadata_impl(self) -> Any:
        # ONNX Runtime's runner reports float16 as a numpy dtype, which Polygraphy's feed coercion cannot compare
        from polygraphy.common import TensorMetadata
        from polygraphy.datatype import DataType

        meta = TensorMetadata()
        for name, (dtype, shape) in self.runner.get_input_metadata().items():
            meta.add(name, DataType.from_dtype(dtype) if dtype is not None else None, shape)
        return meta

    def infer_impl(self, feed_dict: Feed) -> dict[str, np.ndarray]:
        outputs = self.runner.infer(feed_dict)
        self.inference_time = self.runner.last_inference_time()
        return {name: v.astype(np.float32) if v.dtype == np.float16 else v for name, v in outputs.items()}


def _summarise(
    spec: Any, judged: Judgement, stats: ErrorStats | DistributionStats | ShapeStats, anchored: str = ""
) -> OutputAccuracy:
    """One output's figures from its statistics: the verdict is the statistics' own, so they agree; ``anchored``
    says how the anchored rule judged it (:mod:`pipeline.accuracy.anchor`)."""
    tolerance = judged.tolerance
    if isinstance(stats, DistributionStats | ShapeStats):
        nan = float("nan")
        return OutputAccuracy(
            spec.name, spec.dtype, nan, nan, nan, tolerance.atol, tolerance.rtol, stats.passed,
            judged.computed_in, stats.elements, stats.outside, stats.note,
        )  # fmt: skip
    note = "; ".join(filter(None, [judged.note, anchored]))
    if stats.shape_mismatch is not None:
        note = "; ".join(filter(None, [stats.shape_mismatch, note]))
    if stats.one_sided_nan:
        note = "; ".join(filter(None, [f"{stats.one_sided_nan} elements NaN on one side only", note]))
    if stats.all_nan:
        note = "; ".join(filter(None, [ALL_NAN_NOTE, note]))
    return OutputAccuracy(
        name=spec.name,
        dtype=spec.dtype,
        max_abs=stats.max_abs,
        max_rel=stats.max_rel,
        mean_abs=stats.mean_abs,
        atol=tolerance.atol,
        rtol=tolerance.rtol,
        passed=stats.passed,
        computed_in=judged.computed_in,
        elements=stats.elements,
        outside=stats.outside,
        note=note,
        rms_atol=tolerance.rms_atol,
        rms=tolerance.rms,
        atol_used=stats.atol_used,
        relative_rms=stats.relative_rms,
        rms_failed=stats.rms_failed,
    )


@contextlib.contextmanager
def polygraphy_quiet() -> Iterator[None]:
    """Polygraphy logs every iteration; keep it quiet unless our own logger is at DEBUG."""
    if logger.isEnabledFor(logging.DEBUG):
        yield
        return
    with G_LOGGER.verbosity(G_LOGGER.CRITICAL):
        yield
