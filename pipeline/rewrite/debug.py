"""Debug mode of the pass manager: which pass changed the model's outputs?

After every pass that modified the graph, the graph runs on ONNX Runtime on the sample and its outputs are
compared with PyTorch's on the same sample (not with the exported graph, which may hold opaque custom-op nodes no
runtime can run), with the per-dtype tolerances of the settings. The first pass beyond tolerance is named in a
ConversionError. When TensorRT-RTX imports, every such graph is also built with the real builder (CPU-only AOT
build): the first pass after which it no longer builds a graph it built before is named the same way.
"""

from __future__ import annotations

import logging

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort

from converters.errors import ConversionError
from passes.model_io.external_data import ort_session_bytes
from passes.model_io.graphs import NodeMetadata, to_model
from passes.records import PassRecord
from pipeline.precision.buildable import build_error, rtx_available
from pipeline.runtime.io_spec import IOSpec
from pipeline.runtime.plugins import prepare_onnxruntime
from pipeline.settings import Settings

logger = logging.getLogger(__name__)


class PassDebugger:
    """The pass manager's observer in debug mode: checks the graph after every pass that changed it."""

    def __init__(
        self,
        exported: onnx.ModelProto,
        metadata: NodeMetadata,
        io: IOSpec,
        feed: dict[str, np.ndarray],
        reference: dict[str, np.ndarray],
        settings: Settings,
    ) -> None:
        self.template, self.metadata, self.io, self.feed, self.settings = exported, metadata, io, feed, settings
        self.reference = [np.asarray(reference[spec.name]) for spec in io.outputs]
        self.built: bool | None = None  # did the real builder build the graph before this pass? (None: not asked)
        if not rtx_available():
            logger.info("debug mode: TensorRT-RTX is not installed, the passes' graphs are not built with it")

    def __call__(self, record: PassRecord, graph: gs.Graph) -> None:
        model = to_model(graph.copy(), self.template, self.metadata)
        try:
            outputs = self._run(model)
        except Exception as exc:
            raise ConversionError(
                f"after pass {record.name!r} (iteration {record.iteration}) the graph no longer runs on ONNX "
                f"Runtime: {exc}",
                fix=f"fix or remove pass {record.name!r}",
            ) from exc
        for spec, want, got in zip(self.io.outputs, self.reference, outputs, strict=True):
            tolerance = self.settings.tolerance_for(spec.name, spec.dtype)
            if want.shape != got.shape:
                raise ConversionError(
                    f"pass {record.name!r} changed the shape of output {spec.name!r}: {want.shape} -> {got.shape}",
                    fix=f"fix or remove pass {record.name!r}",
                )
            error = np.abs(got.astype(np.float64) - want.astype(np.float64))
            bound = tolerance.atol + tolerance.rtol * np.abs(want.astype(np.float64))
            if np.any(error > bound) or np.any(np.isnan(got) != np.isnan(want)):
                raise ConversionError(
                    f"pass {record.name!r} (iteration {record.iteration}) changed output {spec.name!r} beyond "
                    f"tolerance (atol {tolerance.atol:g}, rtol {tolerance.rtol:g}): max abs error "
                    f"{float(np.nanmax(error)):.3g} on the sample",
                    fix=f"fix or remove pass {record.name!r} (passes=... without it)",
                )
        self._check_builds(record, model)

    def _check_builds(self, record: PassRecord, model: onnx.ModelProto) -> None:
        if not rtx_available():
            return
        if self.built is None:  # the exported graph (opaque custom ops and all): what the first pass started from
            self.built = build_error(self.template, self.settings.dynamic) is None
        error = build_error(model, self.settings.dynamic)
        if error is not None and self.built:
            raise ConversionError(
                f"after pass {record.name!r} (iteration {record.iteration}) TensorRT-RTX no longer builds the graph, "
                f"which it built before that pass: {error}",
                fix=f"fix or remove pass {record.name!r} (passes=... without it)",
            )
        self.built = error is None

    def _run(self, model: onnx.ModelProto) -> list[np.ndarray]:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # judge the graph as written
        prepare_onnxruntime(model, options)  # plugin nodes: their CPU references
        session = ort.InferenceSession(ort_session_bytes(model, options), options, providers=["CPUExecutionProvider"])
        return [np.asarray(o) for o in session.run([o.name for o in self.io.outputs], self.feed)]
