"""Stage: validation. Polygraphy's Comparator runs PyTorch (our runner) and the backend on the same inputs.

Inputs are the sample plus ``settings.validation_inputs`` random inputs drawn like it (seeded): floats from a
normal with the sample's mean and spread, integers (token ids) uniformly within the sample's range. Masks
(booleans, and integer inputs holding only 0 and 1) keep the sample's own pattern, cropped or edge-extended to
the new shape: a random mask would produce fully padded rows, where PyTorch's attention kernels and the exported
graph legitimately disagree. With dynamic dimensions, one more input at every dimension's ``min`` and one at
its ``max``.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
import torch.utils._pytree as pytree
from polygraphy.backend.base import BaseRunner
from polygraphy.logger import G_LOGGER

from converters.errors import AccuracyError, InputError
from converters.settings import DEFAULT_TOLERANCES, Settings
from pipeline.module.io_spec import IOSpec

logger = logging.getLogger(__name__)

Feed = dict[str, np.ndarray]


@dataclass(frozen=True)
class OutputAccuracy:
    """The worst error of one output over all validation inputs, and the rule it was judged by."""

    name: str
    dtype: str
    max_abs: float
    max_rel: float
    mean_abs: float
    atol: float
    rtol: float
    passed: bool


@dataclass(frozen=True)
class AccuracyReport:
    """The validation stage's result: how many inputs were compared, each output's figures, and the rule."""

    inputs: int
    outputs: tuple[OutputAccuracy, ...]
    rule: str = "an element passes when |backend - torch| <= atol or <= rtol * |torch|"

    @property
    def passed(self) -> bool:
        """Every output within its tolerance on every input."""
        return all(o.passed for o in self.outputs)

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data (``report.json``, the artifact's metadata)."""
        return {"inputs": self.inputs, "rule": self.rule, "outputs": [asdict(o) for o in self.outputs]}


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
        # np.require keeps a 0-d feed 0-d (np.ascontiguousarray makes it 1-d, and the model fails on it)
        feed = {k: torch.from_numpy(np.require(v, requirements="C")).to(self.device) for k, v in feed_dict.items()}
        args, kwargs = self.io.feed_to_call(feed)
        start = time.perf_counter()
        with torch.no_grad():
            result = self.model(*args, **kwargs)
        self.inference_time = time.perf_counter() - start
        tensors = [leaf for leaf in pytree.tree_leaves(result) if isinstance(leaf, torch.Tensor)]
        return {spec.name: t.detach().cpu().numpy() for spec, t in zip(self.io.outputs, tensors, strict=True)}


def validation_feeds(io: IOSpec, sample_inputs: list[torch.Tensor], settings: Settings) -> list[Feed]:
    """The sample, then seeded random inputs drawn like it, then (if dynamic) all-min and all-max shapes."""
    rng = np.random.default_rng(settings.seed)
    sample = [t.detach().cpu().numpy() for t in sample_inputs]
    feeds: list[Feed] = [{spec.name: arr for spec, arr in zip(io.inputs, sample, strict=True)}]
    shapes = [list(a.shape) for a in sample]
    shape_sets = [shapes] * settings.validation_inputs
    if settings.dynamic:
        for which in ("min", "max"):
            resized = [list(s) for s in shapes]
            for d in settings.dynamic:
                index = [spec.name for spec in io.inputs].index(d.input)
                resized[index][d.axis] = getattr(d, which)
            shape_sets = [*shape_sets, resized]
    for shape_set in shape_sets:
        feeds.append(
            {
                spec.name: _draw_like(arr, tuple(shape), rng)
                for spec, arr, shape in zip(io.inputs, sample, shape_set, strict=True)
            }
        )
    return feeds


def as_io_types(feeds: list[Feed], io: IOSpec) -> list[Feed]:
    """``feeds`` with each float input in the type ``io`` gives it (float32 -> float16 with precision_io="low")."""
    dtypes = {t.name: t.dtype for t in io.inputs}
    return [{name: _as_type(value, dtypes.get(name)) for name, value in feed.items()} for feed in feeds]


def _as_type(value: np.ndarray, dtype: str | None) -> np.ndarray:
    if dtype is None or value.dtype == np.dtype(dtype) or not np.issubdtype(value.dtype, np.floating):
        return value
    return value.astype(dtype)


def _draw_like(sample: np.ndarray, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    # np.asarray: for a 0-d shape numpy hands back a scalar, which Polygraphy's runners cannot take
    return np.asarray(_draw(sample, shape, rng))


def _draw(sample: np.ndarray, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    if sample.size and (sample.dtype == np.bool_ or (np.issubdtype(sample.dtype, np.integer) and _is_mask(sample))):
        return _resize_like(sample, shape)
    if np.issubdtype(sample.dtype, np.integer):
        lo, hi = (int(sample.min()), int(sample.max())) if sample.size else (0, 1)
        return rng.integers(lo, hi + 1, size=shape).astype(sample.dtype)
    mean = float(sample.mean()) if sample.size else 0.0
    std = float(sample.std()) if sample.size else 1.0
    return (rng.standard_normal(shape) * (std or 1.0) + mean).astype(sample.dtype)


def _is_mask(sample: np.ndarray) -> bool:
    return bool(np.isin(sample, (0, 1)).all())


def _resize_like(sample: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The sample cropped or extended (repeating its last entry along each axis) to ``shape``."""
    if sample.ndim == 0:  # nothing to resize (np.pad refuses the empty pad list of a 0-d array)
        return sample.copy()
    grown = np.pad(sample, [(0, max(0, new - old)) for old, new in zip(sample.shape, shape, strict=True)], mode="edge")
    return np.ascontiguousarray(grown[tuple(slice(0, n) for n in shape)])


def validate(
    model: torch.nn.Module,
    io: IOSpec,
    backend_runner: Any,
    feeds: list[Feed],
    settings: Settings,
    backend_io: IOSpec | None = None,
) -> AccuracyReport:
    """Compare the backend with PyTorch on ``feeds``; raise AccuracyError when an output is out of tolerance.

    ``io`` is the model's; ``backend_io`` the backend's when its types differ (``precision_io="low"``): ``feeds``
    are then in the backend's types, PyTorch gets the same values in the model's (Polygraphy casts each feed to a
    runner's input metadata), and half outputs are compared as float32 with their own type's tolerance."""
    from polygraphy.comparator import Comparator, SimpleCompareFunc

    _check_tolerance_keys(settings, io, model)
    outputs = io.outputs
    if backend_io is not None and backend_io != io:
        backend_runner = _FloatOutputs(backend_runner)
        outputs = backend_io.outputs  # the backend's output dtypes pick the tolerance
    tolerances = {o.name: settings.tolerance_for(o.name, o.dtype) for o in outputs}
    compare = SimpleCompareFunc(
        atol={name: t.atol for name, t in tolerances.items()},
        rtol={name: t.rtol for name, t in tolerances.items()},
        check_error_stat="elemwise",
        infinities_compare_equal=True,
        find_output_func=lambda name, index, result: [name] if name in result else [],
    )
    torch_runner = TorchRunner(model, io)
    # rtol is relative to the second runner's output: PyTorch is the reference, so it comes second.
    with polygraphy_quiet():
        results = Comparator.run([backend_runner, torch_runner], data_loader=feeds)
        _equal_nans(results)
        # Polygraphy divides by the reference for relative errors; 0/0 is its own business, not a user's warning
        with np.errstate(divide="ignore", invalid="ignore"):
            accuracy = Comparator.compare_accuracy(results, compare_func=compare)
    per_iteration = next(iter((accuracy[0] if hasattr(accuracy, "lst") else accuracy).values()))
    report = AccuracyReport(len(feeds), tuple(_summarise(o, tolerances[o.name], per_iteration) for o in outputs))
    if not report.passed:
        failing = [o for o in report.outputs if not o.passed]
        raise AccuracyError(
            "outputs differ from PyTorch beyond tolerance: "
            + "; ".join(
                f"{o.name}: max abs {o.max_abs:.3g} (atol {o.atol:g}), max rel {o.max_rel:.3g} (rtol {o.rtol:g})"
                for o in failing
            ),
            per_output={
                o.name: {"max_abs": o.max_abs, "max_rel": o.max_rel, "atol": o.atol, "rtol": o.rtol}
                for o in report.outputs
            },
            fix="if the difference is expected, loosen it with tolerances={'<output or dtype>': (atol, rtol)}; "
            "otherwise inspect module.onnx, or convert with validate=False to get the module anyway",
        )
    return report


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


def _equal_nans(results: Any) -> None:
    """NaN where both PyTorch and the backend give NaN is agreement (``log`` of a negative sample, a NaN in the
    sample): both are set to 0 there, so only NaNs in different places, or on one side only, count as errors."""
    (_, backend), (_, reference) = results[0], results[1]
    for ours, theirs in zip(backend, reference, strict=True):
        for name in list(theirs.keys()):
            if name not in ours:
                continue
            got, expected = ours[name], theirs[name]
            comparable = isinstance(got, np.ndarray) and got.shape == expected.shape
            if not comparable or not np.issubdtype(expected.dtype, np.floating):
                continue
            both = np.isnan(got) & np.isnan(expected)
            if both.any():
                ours[name] = np.where(both, 0, got).astype(got.dtype)
                theirs[name] = np.where(both, 0, expected).astype(expected.dtype)


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


def _summarise(spec: Any, tolerance: Any, per_iteration: list[Any]) -> OutputAccuracy:
    results = [it[spec.name] for it in per_iteration if spec.name in it]
    if len(results) != len(per_iteration):
        raise AccuracyError(
            f"output {spec.name!r} is missing from the backend's results",
            fix="a pass renamed or removed a graph output; graph outputs must be kept",
        )
    return OutputAccuracy(
        name=spec.name,
        dtype=spec.dtype,
        max_abs=float(max(r.max_absdiff for r in results)),
        max_rel=float(max(r.max_reldiff for r in results)),
        mean_abs=float(np.mean([r.mean_absdiff for r in results])),
        atol=tolerance.atol,
        rtol=tolerance.rtol,
        passed=all(bool(r) for r in results),
    )


@contextlib.contextmanager
def polygraphy_quiet() -> Iterator[None]:
    """Polygraphy logs every iteration; keep it quiet unless our own logger is at DEBUG."""
    if logger.isEnabledFor(logging.DEBUG):
        yield
        return
    with G_LOGGER.verbosity(G_LOGGER.CRITICAL):
        yield
