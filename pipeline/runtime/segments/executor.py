"""The segmented executor: the final graph run segment by segment, each by its own executor.

A :class:`SegmentPlan` is what the artifact keeps: per segment its runtime, its top-level node indices in the final
graph and the specs (dtype, shape, dynamic dimensions) of what it takes and gives. From the plan and the final graph
every segment's model is made again, so a loaded artifact needs no sample; its TensorRT segments' engines are saved
beside it (one per segment).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import torch
from polygraphy.backend.base import BaseRunner
from polygraphy.common import TensorMetadata
from polygraphy.datatype import DataType

from converters.errors import BuildError
from pipeline.runtime.executors import Executor, ExecutorBuilder, load_executor
from pipeline.runtime.io_spec import IOSpec, TensorSpec
from pipeline.runtime.segments.partition import ORT_SEGMENT, TENSORRT_SEGMENT, Segment, segment_model
from pipeline.runtime.segments.shapes import value_info
from pipeline.settings import DynamicDim, Settings


@dataclass(frozen=True)
class PlannedSegment:
    """One segment as built: its runtime, node indices, input and output specs and its inputs' dynamic dims."""

    kind: str
    nodes: tuple[int, ...]
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    dynamic: tuple[DynamicDim, ...] = ()

    @property
    def io(self) -> IOSpec:
        """The segment's inputs and outputs as an :class:`IOSpec` (no Python call structure)."""
        return IOSpec(self.inputs, self.outputs, "", (), "", (), ())

    def settings(self, settings: Settings) -> Settings:
        """``settings`` with this segment's dynamic dimensions (the engine's optimization profile), and the user's
        profiles (``profiles=``: a generation step's prefill and decode) over the dimensions the segment has: a
        dimension a segment's inputs do not have (``sequence`` past the step's first segment) is left out of them,
        and a segment that has none of them builds one profile."""
        import dataclasses

        names = {d.name for d in self.dynamic}
        profiles = tuple(tuple(r for r in profile if r.name in names) for profile in settings.profiles)
        profiles = tuple(dict.fromkeys(profiles)) if any(profiles) else ()
        return dataclasses.replace(settings, dynamic=self.dynamic, profiles=profiles)

    def model(self, final: onnx.ModelProto) -> onnx.ModelProto:
        """The segment's own model, cut from the final graph."""
        values = {s.name: value_info(s) for s in (*self.inputs, *self.outputs)}
        names = tuple(s.name for s in self.inputs), tuple(s.name for s in self.outputs)
        segment = Segment(self.kind, self.nodes, *names)
        return segment_model(final, segment, values)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready data (the artifact's metadata)."""
        return {
            "kind": self.kind,
            "nodes": list(self.nodes),
            "inputs": [[t.name, t.dtype, list(t.shape)] for t in self.inputs],
            "outputs": [[t.name, t.dtype, list(t.shape)] for t in self.outputs],
            "dynamic": [[d.input, d.axis, d.name, d.min, d.opt, d.max] for d in self.dynamic],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PlannedSegment:
        """A segment from :meth:`to_json` data."""
        return cls(
            kind=str(data["kind"]),
            nodes=tuple(int(i) for i in data["nodes"]),
            inputs=tuple(TensorSpec(n, d, tuple(s)) for n, d, s in data["inputs"]),
            outputs=tuple(TensorSpec(n, d, tuple(s)) for n, d, s in data["outputs"]),
            dynamic=tuple(DynamicDim(*d) for d in data["dynamic"]),
        )


class SegmentedExecutor:
    """TensorRT engines for the segments TensorRT takes and ONNX Runtime sessions for the rest, run in order.

    ``backend`` is the TensorRT backend (``tensorrt`` or ``tensorrt-rtx``); ``parts`` holds one executor per segment of
    ``plan``. Values move between the GPU (engines) and the CPU (ONNX Runtime) only at segment boundaries.
    """

    def __init__(self, backend: str, plan: Sequence[PlannedSegment], parts: Sequence[Executor], io: IOSpec) -> None:
        self.backend = backend
        self.plan = tuple(plan)
        self.parts = tuple(parts)
        self.input_names = [t.name for t in io.inputs]
        self.output_names = [t.name for t in io.outputs]
        self.io = io

    @classmethod
    def from_plan(
        cls,
        backend: str,
        final: onnx.ModelProto,
        io: IOSpec,
        settings: Settings,
        plan: Sequence[PlannedSegment],
        engines: Mapping[int, bytes],
        build: ExecutorBuilder | None = None,
    ) -> SegmentedExecutor:
        """The executor of a saved plan over ``final``: TensorRT segments from their ``engines`` (built by ``build``,
        :func:`pipeline.backends.build_executor`, when one is missing), ONNX Runtime segments as sessions."""
        from pipeline.runtime.ort.executor import OnnxRuntimeExecutor

        parts: list[Executor] = []
        for index, segment in enumerate(plan):
            model = segment.model(final)
            if segment.kind == ORT_SEGMENT:
                parts.append(OnnxRuntimeExecutor(model, segment.io, settings))
            else:
                engine, part_settings = engines.get(index), segment.settings(settings)
                if engine is not None:
                    parts.append(load_executor(backend, model, segment.io, part_settings, engine))
                elif build is not None:
                    parts.append(build(backend, model, segment.io, part_settings))
                else:
                    raise BuildError(
                        f"TensorRT segment {index} has no engine to load",
                        fix="load the artifact with rebuild=True to build its engines from the saved graph",
                    )
        return cls(backend, plan, parts, io)

    def rebuilt(self, final: onnx.ModelProto, settings: Settings, build: ExecutorBuilder) -> SegmentedExecutor:
        """The same segments over ``final`` (new weights, same structure: :func:`pipeline.refit`), engines built anew
        by ``build``."""
        return SegmentedExecutor.from_plan(self.backend, final, self.io, settings, self.plan, {}, build)

    @property
    def engine_bytes(self) -> bytes | None:
        """None: a segmented module has one engine per TensorRT segment (:meth:`segment_engines`)."""
        return None

    def segment_engines(self) -> dict[int, bytes]:
        """Segment index -> its serialized engine, for every TensorRT segment."""
        engines = {}
        for index, (segment, part) in enumerate(zip(self.plan, self.parts, strict=True)):
            engine = part.engine_bytes if segment.kind == TENSORRT_SEGMENT else None
            if engine is not None:
                engines[index] = engine
        return engines

    def run(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """Run every segment in order on the values it needs; the graph's outputs in graph order."""
        values = dict(zip(self.input_names, inputs, strict=True))
        for segment, part in zip(self.plan, self.parts, strict=True):
            on_gpu = getattr(part, "runs_on", "") == "engine"
            feed = [_placed(values[s.name], on_gpu) for s in segment.inputs]
            values.update(zip((s.name for s in segment.outputs), part.run(feed), strict=True))
        return [values[name] for name in self.output_names]

    def polygraphy_runner(self, name: str) -> Any:
        """A Polygraphy runner over the whole segmented module (validation and comparison use it)."""
        return SegmentedRunner(self, name)


def _placed(tensor: torch.Tensor, on_gpu: bool) -> torch.Tensor:
    if on_gpu and not tensor.is_cuda:
        return tensor.cuda()
    return tensor


class SegmentedRunner(BaseRunner):
    """Polygraphy's runner interface over a :class:`SegmentedExecutor` (numpy in, numpy out)."""

    def __init__(self, executor: SegmentedExecutor, name: str) -> None:
        super().__init__(name=name, prefix="segments-runner")
        self.executor = executor

    def activate_impl(self) -> None:
        """Nothing to set up: the executors are built."""

    def deactivate_impl(self) -> None:
        """Nothing to release: the executors belong to the module."""

    def get_input_metadata_impl(self) -> Any:
        """The graph inputs' dtypes and shapes (symbolic dimensions as names)."""
        meta = TensorMetadata()
        for spec in self.executor.io.inputs:
            dtype = DataType.from_dtype(torch.bfloat16 if spec.dtype == "bfloat16" else np.dtype(spec.dtype))
            meta.add(spec.name, dtype=dtype, shape=list(spec.shape))
        return meta

    def infer_impl(self, feed_dict: Mapping[str, Any]) -> OrderedDict[str, np.ndarray]:
        """Run the segments on the feed; the outputs by name as numpy arrays."""
        tensors = [torch.from_numpy(np.ascontiguousarray(feed_dict[name])) for name in self.executor.input_names]
        start = time.perf_counter()
        outputs = self.executor.run(tensors)
        self.inference_time = time.perf_counter() - start
        return OrderedDict(
            (name, out.detach().cpu().numpy()) for name, out in zip(self.executor.output_names, outputs, strict=True)
        )


__all__ = ["ORT_SEGMENT", "TENSORRT_SEGMENT", "PlannedSegment", "SegmentedExecutor", "SegmentedRunner"]
