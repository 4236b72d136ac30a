"""The converted model: a ``torch.nn.Module`` with the original call signature, running on a backend."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnx
import torch
from onnx import ModelProto

from converters.errors import ArtifactError, InputError
from converters.files import write_file_atomically
from passes.model_io.external_data import WeightFiles, save_onnx
from pipeline.runtime.artifact import runtime_cache_beside, save_artifact
from pipeline.runtime.executors import Executor
from pipeline.runtime.io_spec import IOSpec
from pipeline.settings import Settings

if TYPE_CHECKING:
    from pipeline.runtime.reports.conversion import ConversionReport


class ConvertedModule(torch.nn.Module):
    """Call it like the original model; tensors come back on the device of the inputs.

    ``.onnx`` is the final graph, ``.report`` the conversion report, ``.save(path)`` writes one artifact and
    ``.save_onnx(path)`` the graph alone (with a ``.data`` file beside it when the weights are external). Giving it
    new weights and comparing it with PyTorch are conversion work: :func:`pipeline.refit` and
    :func:`pipeline.compare` (``module=``), so that a deployment that only loads and runs imports the runtime alone.
    """

    def __init__(
        self,
        executor: Executor,
        io: IOSpec,
        onnx_model: onnx.ModelProto,
        settings: Settings,
        report: ConversionReport | Mapping[str, Any],
        weights: WeightFiles | None = None,
        conversion_source: Any = None,
    ) -> None:
        super().__init__()
        #: what ``convert`` used besides the settings (the model, sample, converters, passes), read by
        #: :func:`pipeline.refit`; None for a loaded module
        self.conversion_source = conversion_source
        self._executor = executor
        self._weights = weights  # the external weights of onnx_model (large models) live while the module does
        _held_by(executor, weights)
        self.io = io
        self._onnx = onnx_model
        self.settings = settings
        self._report: ConversionReport | Mapping[str, Any] = report
        self._dims = {(d.input, d.axis): d for d in settings.dynamic}
        self._warned_grad = False  # an input that requires grad is said once per module, not on every call

    @property
    def report(self) -> ConversionReport:
        """The conversion report. A loaded module is handed the artifact's record of it, read into the report when
        first asked for: a deployment that loads and runs does not import the report's classes."""
        from pipeline.runtime.reports.conversion import ConversionReport

        report = self._report
        if not isinstance(report, ConversionReport):  # the artifact's record, read now
            try:
                report = ConversionReport.from_dict(dict(report))
            except (KeyError, TypeError, ValueError, AttributeError) as exc:  # not AttributeError to nn.Module
                raise ArtifactError(
                    f"the artifact's conversion report does not read: {type(exc).__name__}: {exc}",
                    fix="convert the model again and save a new artifact",
                ) from exc
            self._report = report
        return report

    @report.setter
    def report(self, report: ConversionReport | Mapping[str, Any]) -> None:
        """Replace the report (a report, or an artifact's record of one, read when first asked for)."""
        self._report = report

    @property
    def onnx(self) -> onnx.ModelProto:
        """The final ONNX graph (what the backend runs)."""
        return self._onnx

    @property
    def backend(self) -> str:
        """The backend the module runs on (``onnxruntime``, ``tensorrt``, ...)."""
        return self._executor.backend

    @property
    def runs_on(self) -> str:
        """What calls run on: the backend, or ``onnxruntime`` for a TensorRT-RTX module whose engine cannot run
        here (the same final graph runs on ONNX Runtime; ``report.backend_reason`` says why)."""
        return "onnxruntime" if getattr(self._executor, "runs_on", None) == "onnxruntime" else self.backend

    @property
    def engine_bytes(self) -> bytes | None:
        """The serialised TensorRT engine, or None on a backend without one."""
        return self._executor.engine_bytes

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the backend on the flattened inputs; outputs in the original model's structure."""
        inputs = self.io.flatten_call(args, kwargs)
        self._check(inputs)
        if not self._warned_grad and torch.is_grad_enabled():
            self._warn_on_grad(inputs)
        device = inputs[0].device
        outputs = self._executor.run(inputs)
        return self.io.unflatten_outputs([o if o.device == device else o.to(device) for o in outputs])

    def run_flat(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """Run the graph on its inputs in the order of ``module.io.inputs``; its outputs in the order of
        ``module.io.outputs``. The inputs are checked as a call's are (dtype, rank, declared sizes). A server
        that speaks in named graph tensors (Triton) calls this instead of the model-shaped ``forward``."""
        if len(inputs) != len(self.io.inputs):
            raise InputError(
                f"the graph takes {len(self.io.inputs)} inputs ({', '.join(t.name for t in self.io.inputs)}), "
                f"not {len(inputs)}",
                fix="pass one tensor per graph input, in the order of module.io.inputs",
            )
        self._check(inputs)
        return self._executor.run(inputs)

    @property
    def executor(self) -> Executor:
        """The backend's executor (ONNX Runtime session, TensorRT engine, segments) the module calls."""
        return self._executor

    def rebind(
        self, executor: Executor, onnx_model: ModelProto, report: ConversionReport, weights: WeightFiles | None
    ) -> None:
        """Run ``executor`` on ``onnx_model`` from now on, with ``report`` (``weights``: the graph's external weights,
        kept alive with the module). :func:`pipeline.refit` calls it with the graph of the new weights."""
        self._executor, self._onnx, self.report, self._weights = executor, onnx_model, report, weights
        _held_by(executor, weights)

    def save(self, path: str | Path, *, metadata: Mapping[str, Any] | None = None) -> Path:
        """Write the final ONNX, the engine (if any) and metadata to one file, atomically (:func:`pipeline.load`
        reads it back); a TensorRT-RTX module that ran here also leaves its runtime cache beside it. A module of
        TensorRT segments saves its segment plan and one engine per TensorRT segment. ``metadata``: JSON-ready entries
        of the caller's, kept in the artifact's metadata (``pipeline.runtime.artifact_reading.read_metadata``)."""
        from pipeline.runtime.segments.executor import SegmentedExecutor

        segmented = self._executor if isinstance(self._executor, SegmentedExecutor) else None
        cache = getattr(self._executor, "runtime_cache_file", None)  # TensorRT-RTX's JIT kernels, when it ran here
        if cache is not None and Path(cache).is_file():
            write_file_atomically(runtime_cache_beside(Path(path)), Path(cache).read_bytes())
        return save_artifact(
            Path(path),
            onnx_model=self._onnx,
            engine=self.engine_bytes,
            backend=self.backend,
            io=self.io,
            settings=self.settings,
            report=self.report,
            segments=None if segmented is None else [p.to_json() for p in segmented.plan],
            segment_engines=None if segmented is None else segmented.segment_engines(),
            refit_at_load=bool(getattr(self._executor, "refit_at_load", False)),
            extra_metadata=metadata,
        )

    def save_onnx(self, path: str | Path) -> list[Path]:
        """Write the final graph to ``path`` for other tools (polygraphy, trtexec, ONNX Runtime), atomically.

        A graph with external weights gets them in one ``<name>.data`` file beside it (``onnx.save`` would not
        find them: they live in the module's private weights directory). Returns the files written.
        """
        return save_onnx(self._onnx, path)

    def __getattr__(self, name: str) -> Any:
        if name in _MOVED:  # the methods that became conversion functions: say where they went
            raise AttributeError(
                f"ConvertedModule.{name} is now pipeline.{name}: {_MOVED[name]} (conversion work lives in the "
                "conversion layer, so that loading and running a module imports the runtime alone)"
            )
        return super().__getattr__(name)

    def _warn_on_grad(self, inputs: list[torch.Tensor]) -> None:
        """Autograd does not see through the backend: say so (once) when the caller may expect a backward."""
        grads = [spec.name for spec, tensor in zip(self.io.inputs, inputs, strict=True) if tensor.requires_grad]
        if grads:
            self._warned_grad = True
            warnings.warn(
                f"input(s) {', '.join(map(repr, grads))} require grad, but the converted module runs an inference "
                f"graph on {self.backend}: its outputs carry no grad_fn and no gradient reaches the inputs (said "
                "once per module); train the original model, or call under torch.no_grad() to silence this",
                stacklevel=_caller_level(),
            )

    def _check(self, inputs: list[torch.Tensor]) -> None:
        sizes: dict[str, tuple[str, int]] = {}
        for spec, tensor in zip(self.io.inputs, inputs, strict=True):
            if tensor.is_meta:
                raise InputError(
                    f"input {spec.name!r} is a meta tensor (a shape without data): the backend needs values to run",
                    fix="pass a tensor with data; a model built on the meta device needs its weights loaded "
                    "(e.g. load_state_dict(..., assign=True)) and real inputs",
                )
            if tensor.dtype != spec.torch_dtype:
                raise InputError(
                    f"input {spec.name!r} is {str(tensor.dtype).removeprefix('torch.')}, the graph takes {spec.dtype}",
                    fix=f"pass a {spec.dtype} tensor, e.g. x.to(torch.{spec.dtype})",
                )
            if tensor.dim() != len(spec.shape):
                raise InputError(
                    f"input {spec.name!r} has rank {tensor.dim()}, the graph takes rank {len(spec.shape)} "
                    f"{list(spec.shape)}",
                    fix="pass a tensor of the sample's rank",
                )
            for axis, (size, declared) in enumerate(zip(tensor.shape, spec.shape, strict=True)):
                self._check_dim(spec.name, axis, int(size), declared, sizes)

    def _check_dim(
        self, name: str, axis: int, size: int, declared: int | str, sizes: dict[str, tuple[str, int]]
    ) -> None:
        dim = self._dims.get((name, axis))
        if dim is None:
            if isinstance(declared, int) and size != declared:
                raise InputError(
                    f"input {name!r} has size {size} on axis {axis}; the graph was converted with the fixed size "
                    f"{declared}",
                    fix=f"declare the axis dynamic when converting: dynamic={{{name!r}: {{{axis}: "
                    f"('dim_name', min, opt, max)}}}}",
                )
            return
        if not dim.min <= size <= dim.max:
            raise InputError(
                f"input {name!r} has size {size} on axis {axis} ({dim.name!r}), outside the declared range "
                f"[{dim.min}, {dim.max}]",
                fix=f"convert again with a wider range for {dim.name!r}, or pass a size within it",
            )
        if size % dim.multiple:
            raise InputError(
                f"input {name!r} has size {size} on axis {axis} ({dim.name!r}), not a multiple of {dim.multiple}: the "
                f"model needs multiples of {dim.multiple} there (found at export)",
                fix=f"pass a size that is a multiple of {dim.multiple} (the pipeline rounds it: e.g. height and width "
                "divisible by the VAE and UNet scale factors)",
            )
        seen = sizes.setdefault(dim.name, (name, size))
        if seen[1] != size:
            raise InputError(
                f"dimension {dim.name!r} is {seen[1]} in input {seen[0]!r} but {size} in input {name!r}",
                fix="inputs that share a dynamic dimension must agree on its size",
            )


#: ``module.<name>`` -> its replacement, for the AttributeError of code written against the methods
_MOVED = {
    "refit": "pipeline.refit(module, new_model_or_state_dict, sample=None, calibration=None)",
    "compare": "pipeline.compare(model, inputs, module=module, ...)",
}


def _caller_level() -> int:
    """The ``stacklevel`` of the first frame outside this module and torch's ``nn.Module`` call machinery (the
    user's line), counted from the function that calls this one."""
    inside = (__file__, torch.nn.Module.__call__.__code__.co_filename)
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and frame.f_code.co_filename in inside:
        frame, level = frame.f_back, level + 1
    return level


def _held_by(executor: Executor, weights: WeightFiles | None) -> None:
    """``weights`` kept alive by ``executor`` too, where it makes a session in the background (ONNX Runtime's
    prepacked session: a module dropped during the build must not remove the weights it reads)."""
    hold = getattr(executor, "hold", None)
    if weights is not None and callable(hold):
        hold(weights)
