"""The runners of a comparison: PyTorch as the reference (optionally in float64), PyTorch with forward hooks
recording module outputs, and ONNX Runtime / TensorRT on the graphs; all of them Polygraphy runners."""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import torch
import torch.utils._pytree as pytree

from converters.errors import BuildError, InputError
from pipeline.comparison import EXPORTED, FINAL, RUNNERS, TENSORRT, TENSORRT_RTX
from pipeline.runtime.io_spec import IOSpec
from pipeline.settings import Settings
from pipeline.validation.stage import Feed, TorchRunner, tensor_from_array

logger = logging.getLogger(__name__)

DESCRIPTIONS: dict[str, str] = {
    EXPORTED: "ONNX Runtime on the exported graph (before the passes)",
    FINAL: "ONNX Runtime on the final graph",
    TENSORRT: "TensorRT engine of the final graph",
    TENSORRT_RTX: "TensorRT-RTX engine of the final graph",
}

# Domains ONNX Runtime runs without extra libraries; any other domain on a node is an opaque custom op.
_STANDARD_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", "com.microsoft"})


@dataclass(frozen=True)
class RunnerPlan:
    """One backend runner of a comparison, or why it was left out (``runner`` is then None)."""

    name: str
    description: str
    runner: Any = None
    skipped: str | None = None


class TorchReference(TorchRunner):
    """PyTorch on a Polygraphy feed; with ``float64`` a float64 copy of the model on float64 inputs. Outputs put
    in ``ready`` (computed ahead by :class:`ReferenceScreen`) are returned by the next ``infer`` instead of running
    the model again."""

    def __init__(self, model: torch.nn.Module, io: IOSpec, name: str, float64: bool = False) -> None:
        super().__init__(float64_copy(model) if float64 else model, io, name=name)
        self.float64 = float64
        self.ready: dict[str, np.ndarray] | None = None
        self.last_feed: Feed = {}  # the feed of the latest comparison (the anchored rule runs PyTorch on it again)

    def call(self, feed_dict: Feed) -> dict[str, np.ndarray]:
        """The model's outputs on one feed (in float64 when the reference is float64); PyTorch's errors as raised."""
        return super().call(cast_feed(feed_dict) if self.float64 else feed_dict)

    def infer_impl(self, feed_dict: Feed) -> dict[str, np.ndarray]:
        """The outputs computed ahead for this feed, else the model's on it (an InputError if PyTorch refuses)."""
        self.last_feed = feed_dict
        ready, self.ready = self.ready, None
        return ready if ready is not None else super().infer_impl(feed_dict)


class ReferenceScreen:
    """The PyTorch references of a comparison as one runner that ``ScreenedFeeds`` runs
    ahead on each drawn feed: every reference runs it (a float64 copy may refuse what float32 takes, or the other
    way round), and one refusing drops the feed for all; the outputs wait in each reference's ``ready``."""

    def __init__(self, references: Sequence[TorchReference]) -> None:
        self.references = list(references)

    @property
    def ready(self) -> dict[str, np.ndarray] | None:
        """The first reference's outputs computed ahead (the others' are in their own ``ready``)."""
        return self.references[0].ready

    @ready.setter
    def ready(self, outputs: dict[str, np.ndarray] | None) -> None:
        """Keep the first reference's outputs computed ahead."""
        self.references[0].ready = outputs

    def call(self, feed_dict: Feed) -> dict[str, np.ndarray]:
        """Every reference's outputs on the feed (the first's returned); whatever PyTorch raises is raised."""
        outputs = [r.call(feed_dict) for r in self.references]  # all run before any is kept
        for reference, ahead in zip(self.references[1:], outputs[1:], strict=True):
            reference.ready = ahead
        return outputs[0]

    def get_input_metadata(self, use_numpy_dtypes: bool = True) -> Any:
        """The first reference's input metadata (all references take the same inputs)."""
        return self.references[0].get_input_metadata(use_numpy_dtypes=use_numpy_dtypes)


class ModuleOutputRunner(TorchRunner):
    """PyTorch with forward hooks: returns ``{module path: first tensor of the module's output}`` for the given
    modules (the last call when a module runs several times), instead of the model's outputs."""

    def __init__(self, model: torch.nn.Module, io: IOSpec, modules: Sequence[str], float64: bool = False) -> None:
        super().__init__(model, io, name="torch-modules")
        self.modules = list(modules)
        self.float64 = float64
        self._recorded: dict[str, np.ndarray] = {}
        self._handles: list[Any] = []

    def activate_impl(self) -> None:
        """Put a forward hook on every compared module."""
        named = dict(self.model.named_modules())
        for path in self.modules:
            self._handles.append(named[path].register_forward_hook(self._hook(path)))

    def deactivate_impl(self) -> None:
        """Remove the hooks."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _hook(self, path: str) -> Callable[..., None]:
        def record(module: torch.nn.Module, args: Any, output: Any) -> None:
            tensor = first_tensor(output)
            if tensor is not None:
                # a copy now: a later in-place op (``hidden += residual``) must not change what was recorded
                self._recorded[path] = tensor.detach().cpu().clone().numpy()

        return record

    def infer_impl(self, feed_dict: Feed) -> dict[str, np.ndarray]:
        """Run the model and return its outputs and every hooked module's output, by tensor name."""
        self._recorded = {}
        feed = {k: tensor_from_array(v).to(self.device) for k, v in feed_dict.items()}
        args, kwargs = self.io.feed_to_call(cast_feed(feed) if self.float64 else feed)
        start = time.perf_counter()
        with torch.no_grad():
            self.model(*args, **kwargs)
        self.inference_time = time.perf_counter() - start
        recorded, self._recorded = self._recorded, {}
        return recorded


def first_tensor(output: Any) -> torch.Tensor | None:
    """The first tensor leaf of a module's output (a tensor, tuple, dict or ModelOutput), if any."""
    return next((leaf for leaf in pytree.tree_leaves(output) if isinstance(leaf, torch.Tensor)), None)


def float64_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A deep copy of ``model`` with floating parameters and buffers in float64 (the original is untouched)."""
    return copy.deepcopy(model).to(torch.float64)


def cast_feed(feed: dict[str, Any]) -> dict[str, Any]:
    """Floating inputs (numpy or torch) cast to float64; others unchanged."""
    out: dict[str, Any] = {}
    for name, value in feed.items():
        if isinstance(value, torch.Tensor):
            out[name] = value.to(torch.float64) if value.is_floating_point() else value
        else:
            out[name] = value.astype(np.float64) if np.issubdtype(value.dtype, np.floating) else value
    return out


def onnxruntime_session(model: onnx.ModelProto, io: IOSpec, settings: Settings) -> Any:
    """An ONNX Runtime session on ``model`` with the project's session options (BuildError if it cannot load)."""
    from pipeline.runtime.ort.executor import OnnxRuntimeExecutor

    return OnnxRuntimeExecutor(model, io, settings).session


def opaque_ops(model: onnx.ModelProto) -> list[str]:
    """``domain::op`` of every node in a non-standard domain that no model-local function defines."""
    local = {(f.domain, f.name) for f in model.functions}
    found = {
        f"{n.domain}::{n.op_type}"
        for n in model.graph.node
        if n.domain not in _STANDARD_DOMAINS and (n.domain, n.op_type) not in local
    }
    return sorted(found)


def plan_runners(
    backends: str | Sequence[str],
    exported: onnx.ModelProto | None,
    final: onnx.ModelProto,
    io: IOSpec,
    settings: Settings,
    backend_runner: Callable[[str], Any] | None = None,
) -> list[RunnerPlan]:
    """The backend runners to compare with PyTorch. ``backends="auto"``: ONNX Runtime on the exported and the
    final graph, and TensorRT and TensorRT-RTX where their engines can run (else left out with the reason); a named
    backend that cannot run is an error.
    ``backend_runner(name)`` supplies an existing runner (a converted module's own executor)."""
    wanted, auto = _wanted(backends)
    plans = []
    for name in wanted:
        if backend_runner is not None and (existing := backend_runner(name)) is not None:
            plans.append(RunnerPlan(name, DESCRIPTIONS[name], runner=existing))
        elif name == EXPORTED:
            plans.append(_exported_plan(exported, io, settings, auto))
        elif name == FINAL:
            plans.append(RunnerPlan(FINAL, DESCRIPTIONS[FINAL], _onnxruntime_runner(final, io, settings, FINAL)))
        elif name == TENSORRT:
            plans.append(_tensorrt_plan(final, io, settings, auto))
        else:
            plans.append(_rtx_plan(final, io, settings, auto))
    return plans


def check_backends(backends: str | Sequence[str]) -> None:
    """Raise InputError for an unknown backend name (before any work is done)."""
    _wanted(backends)


def _wanted(backends: str | Sequence[str]) -> tuple[list[str], bool]:
    if backends == "auto":
        return list(RUNNERS), True
    names = [backends] if isinstance(backends, str) else list(backends)
    unknown = [n for n in names if n not in RUNNERS]
    if unknown or not names:
        raise InputError(
            f"unknown comparison backend(s) {unknown or names}",
            fix=f"use 'auto' or a list of: {', '.join(RUNNERS)}",
        )
    return list(dict.fromkeys(names)), False


def _onnxruntime_runner(model: onnx.ModelProto, io: IOSpec, settings: Settings, name: str) -> Any:
    from polygraphy.backend.onnxrt import OnnxrtRunner

    return OnnxrtRunner(onnxruntime_session(model, io, settings), name=name)


def _exported_plan(exported: onnx.ModelProto | None, io: IOSpec, settings: Settings, auto: bool) -> RunnerPlan:
    if exported is None:
        why = "a converted module does not keep the exported graph; use pipeline.compare(model, inputs) for it"
    elif opaque := opaque_ops(exported):
        why = f"the exported graph holds opaque custom-op nodes ({', '.join(opaque)}) that only the converters lower"
    else:
        try:
            return RunnerPlan(EXPORTED, DESCRIPTIONS[EXPORTED], _onnxruntime_runner(exported, io, settings, EXPORTED))
        except BuildError as exc:
            why = str(exc).splitlines()[0]
    if not auto:
        raise InputError(f"cannot run {EXPORTED}: {why}", fix=f"leave {EXPORTED!r} out of backends")
    logger.info("%s left out: %s", EXPORTED, why)
    return RunnerPlan(EXPORTED, DESCRIPTIONS[EXPORTED], skipped=why)


def _tensorrt_plan(final: onnx.ModelProto, io: IOSpec, settings: Settings, auto: bool) -> RunnerPlan:
    from pipeline.backends import build_executor
    from pipeline.runtime.executors import select_backend
    from pipeline.runtime.tensorrt.identity import tensorrt_status

    available, why = tensorrt_status()
    if not available and auto:
        logger.info("%s left out: %s", TENSORRT, why)
        return RunnerPlan(TENSORRT, DESCRIPTIONS[TENSORRT], skipped=why)
    select_backend(TENSORRT)  # raises BuildError with the reason when TensorRT was named and cannot run
    executor = build_executor(TENSORRT, final, io, settings)
    return RunnerPlan(TENSORRT, DESCRIPTIONS[TENSORRT], executor.polygraphy_runner(TENSORRT))


def _rtx_plan(final: onnx.ModelProto, io: IOSpec, settings: Settings, auto: bool) -> RunnerPlan:
    """TensorRT-RTX's engine where it runs; where it only builds (no supported GPU), left out saying so: comparing
    ONNX Runtime under its name would compare nothing new."""
    from pipeline.backends import build_executor
    from pipeline.runtime.tensorrt.identity import engine_runtime_status
    from pipeline.runtime.tensorrt.library import TENSORRT_RTX as RTX_LIBRARY

    if not RTX_LIBRARY.importable():
        why = f"the {RTX_LIBRARY.module_name} package does not import (pip install tensorrt-rtx)"
    else:
        runnable, status = engine_runtime_status(RTX_LIBRARY, settings)
        if runnable:
            executor = build_executor(TENSORRT_RTX, final, io, settings)
            return RunnerPlan(TENSORRT_RTX, DESCRIPTIONS[TENSORRT_RTX], executor.polygraphy_runner(TENSORRT_RTX))
        why = (
            f"TensorRT-RTX {RTX_LIBRARY.version()} can build the engine here but not run it: {status} "
            "(`pipeline convert --backend tensorrt-rtx` builds it)"
        )
    if not auto:
        raise BuildError(
            f"cannot compare {TENSORRT_RTX}: {why}",
            fix="compare on a GPU TensorRT-RTX supports (compute capability 8.0 or later), or leave "
            f"{TENSORRT_RTX!r} out of the backends",
        )
    logger.info("%s left out: %s", TENSORRT_RTX, why)
    return RunnerPlan(TENSORRT_RTX, DESCRIPTIONS[TENSORRT_RTX], skipped=why)
