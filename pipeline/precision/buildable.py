"""Does the real builder build this graph? TensorRT-RTX's ONNX parser and builder, run on the CPU (AOT build).

TensorRT-RTX parses and builds engines without a GPU, so a candidate graph of the precision search, or the graph
after a pass in debug mode, can be held to what the real builder accepts: a float16 graph that parses may still
fail inside the builder's fusions (see :mod:`passes.precision.convert`). The library is optional: :func:`rtx_available`
says whether it imports (one lazy import), and callers skip the check with a log line when it does not.

This is a stop-gap beside the TensorRT-RTX backend (``pipeline/backends/``): the two build functions are to be merged.

>>> build_error(model, settings.dynamic)   # doctest: +SKIP
"build: ... mha_fusion.cpp:3156: CHECK(...) failed"
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import onnx

from converters.errors import BuildError
from converters.shapes import ProfileRange, profile_dims
from passes.model_io.external_data import base_dir_of
from pipeline.settings import DynamicDim

logger = logging.getLogger(__name__)


@functools.cache
def _tensorrt_rtx() -> ModuleType | None:
    try:
        import tensorrt_rtx
    except ImportError as exc:  # an optional extra: the caller logs that the check is skipped
        logger.debug("tensorrt_rtx does not import: %s", exc)
        return None
    return tensorrt_rtx


def rtx_available() -> bool:
    """True when ``tensorrt_rtx`` imports (``pip install tensorrt-rtx``)."""
    return _tensorrt_rtx() is not None


def build_error(
    model: onnx.ModelProto,
    dynamic: Sequence[DynamicDim] = (),
    profiles: tuple[tuple[ProfileRange, ...], ...] = (),
) -> str | None:
    """None when TensorRT-RTX parses and builds ``model``; otherwise the parser's per-node errors or the builder's
    error text. ``dynamic`` gives each symbolic input dimension its (min, opt, max) for the optimization profile;
    ``profiles`` (``settings.profiles``) makes several, each overriding the ranges it names.

    Raises BuildError when ``tensorrt_rtx`` does not import: check :func:`rtx_available` first.
    """
    trt = _tensorrt_rtx()
    if trt is None:
        raise BuildError("TensorRT-RTX does not import", fix="pip install 'tensorrt-rtx==1.7.1.116'")
    logger_ = _error_logger(trt)
    builder = trt.Builder(logger_)
    network = builder.create_network(0)  # always strongly typed: the graph's types are the engine's
    parser = trt.OnnxParser(network, logger_)
    directory = base_dir_of(model)
    path = None if directory is None else str(directory / "model.onnx")  # the parser reads weights beside it
    if not parser.parse(model.SerializeToString(), path):
        return "parse: " + "; ".join(_parser_error(parser.get_error(i)) for i in range(parser.num_errors))
    config = builder.create_builder_config()
    for dims in profile_dims(tuple(dynamic), profiles):
        profile_error = _add_profile(trt, builder, network, config, dims)
        if profile_error:
            return profile_error
    if builder.build_serialized_network(network, config) is None:
        return "build: " + ("; ".join(logger_.errors) or "build_serialized_network returned None")
    return None


def _parser_error(error: Any) -> str:
    where = f"node {error.node_name()!r} ({error.node_operator()})" if error.node_name() else "model"
    return f"{where}: {error.desc()}"


def _add_profile(trt: ModuleType, builder: Any, network: Any, config: Any, dynamic: Sequence[DynamicDim]) -> str:
    """One optimization profile when an input has symbolic dims; an error text when a dim has no declared range."""
    ranges = {(d.input, d.axis): d for d in dynamic}
    profile = None
    for index in range(network.num_inputs):
        tensor = network.get_input(index)
        shape = list(tensor.shape)
        if all(s >= 0 for s in shape):
            continue
        low, opt, high = list(shape), list(shape), list(shape)
        for axis, size in enumerate(shape):
            if size >= 0:
                continue
            dim = ranges.get((tensor.name, axis))
            if dim is None:
                return f"profile: input {tensor.name!r} axis {axis} is dynamic but has no declared range"
            low[axis], opt[axis], high[axis] = dim.min, dim.opt, dim.max
        profile = profile or builder.create_optimization_profile()
        profile.set_shape(tensor.name, low, opt, high)
    if profile is not None:
        config.add_optimization_profile(profile)
    return ""


def _error_logger(trt: ModuleType) -> Any:
    """A TensorRT logger that keeps error messages (the builder's reason for returning None)."""

    class Logger(trt.ILogger):  # type: ignore[name-defined]
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.errors: list[str] = []

        def log(self, severity: Any, msg: str) -> None:
            if severity in (trt.ILogger.ERROR, trt.ILogger.INTERNAL_ERROR):
                self.errors.append(msg)

    return Logger()


class BuilderGate:
    """Holds low-precision candidates to the real builder, when that means something: TensorRT-RTX imports and
    builds the float32 graph (a graph with plugin nodes or ops the builder lacks is not the precision's fault).

    The float32 graph is built only when a candidate is rejected (a candidate that builds passes either way), so a
    conversion whose low-precision graph builds pays one build here, not two.

    >>> gate = BuilderGate(fp32_model, settings.dynamic)    # doctest: +SKIP
    >>> gate.rejects(candidate)                             # None, or the builder's reason
    """

    def __init__(self, reference: onnx.ModelProto, dynamic: Sequence[DynamicDim] = ()) -> None:
        self.reference = reference
        self.dynamic = tuple(dynamic)
        self.builds = 0
        self._reference_builds: bool | None = None  # not known until a candidate is rejected
        self.available = rtx_available()
        if not self.available:
            logger.info("TensorRT-RTX is not installed: candidate graphs are not checked with its builder")

    @property
    def enabled(self) -> bool:
        """TensorRT-RTX imports and builds the float32 graph (building it now if no candidate has needed it)."""
        if not self.available:
            return False
        if self._reference_builds is None:
            error = build_error(self.reference, self.dynamic)
            self.builds += 1
            self._reference_builds = error is None
            if error is not None:
                logger.info("TensorRT-RTX does not build the float32 graph; candidates are not held to it: %s", error)
        return self._reference_builds

    def rejects(self, model: onnx.ModelProto) -> str | None:
        """None when the builder builds ``model`` (or the gate is off); otherwise the builder's reason."""
        if not self.available or self._reference_builds is False:  # off: the float32 graph does not build either
            return None
        self.builds += 1
        error = build_error(model, self.dynamic)
        if error is None or not self.enabled:
            return None
        return error
