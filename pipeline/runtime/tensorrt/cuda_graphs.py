"""CUDA graphs for TensorRT engines (``cuda_graphs=True``): the engine's work for one set of input shapes captured
once and replayed, which removes the per-layer launch cost of small batches.

TensorRT leaves capture to the application: after a shape change the context is run once (TensorRT sets up its
per-shape state then), then ``execute_async_v3`` is captured into a ``torch.cuda.CUDAGraph`` over fixed input and
output buffers; a call with the same shapes copies its inputs into those buffers, replays the graph and returns
copies of the outputs. A new shape captures anew (one graph is kept, as Torch-TensorRT does). Engines with
data-dependent output shapes cannot be captured (TensorRT allocates their outputs while it runs): a BuildError.
TensorRT-RTX captures graphs itself (``IRuntimeConfig.cuda_graph_strategy``, ``pipeline.runtime.tensorrt.rtx``).

Untested without a GPU (none here); it uses torch's CUDA graph API and the runner's public methods only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from converters.errors import BuildError

ShapeKey = tuple[tuple[int, ...], ...]


@dataclass
class CapturedGraph:
    """One capture: the input shapes it is for, its fixed buffers and the graph."""

    shapes: ShapeKey
    inputs: dict[str, torch.Tensor]
    outputs: dict[str, torch.Tensor]
    graph: torch.cuda.CUDAGraph
    keep_alive: list[torch.Tensor]


class BindingRunner(Protocol):
    """What a capture needs of the engine's runner (``pipeline.runtime.tensorrt.runner.EngineRunner``)."""

    inputs: list[str]
    outputs: list[str]
    device: torch.device
    context: Any

    def bind(self, inputs: dict[str, torch.Tensor]) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
        """Set the shapes and addresses of ``inputs`` on the context; what to keep alive, and the outputs."""
        ...


class CudaGraphs:
    """Runs an engine's runner through a CUDA graph captured for the current input shapes."""

    def __init__(self, runner: BindingRunner) -> None:
        self.runner = runner
        self.captured: CapturedGraph | None = None

    def run(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Replay the graph of these input shapes (captured first if the shapes changed); copies of the outputs."""
        shapes = tuple(tuple(inputs[name].shape) for name in self.runner.inputs)
        with torch.cuda.device(self.runner.device):
            if self.captured is None or self.captured.shapes != shapes:
                self.captured = self._capture(inputs, shapes)
            for name, buffer in self.captured.inputs.items():
                buffer.copy_(inputs[name], non_blocking=True)
            self.captured.graph.replay()
            return {name: tensor.clone() for name, tensor in self.captured.outputs.items()}

    def _capture(self, inputs: dict[str, torch.Tensor], shapes: ShapeKey) -> CapturedGraph:
        runner = self.runner
        fixed = {name: inputs[name].to(runner.device).contiguous().clone() for name in runner.inputs}
        keep_alive, outputs = runner.bind(fixed)
        dynamic = [name for name in runner.outputs if name not in outputs]
        if dynamic or any(t.device.type != "cuda" for t in keep_alive):
            raise BuildError(
                f"cuda_graphs=True cannot capture this engine: outputs {dynamic} have data-dependent shapes or it "
                "takes shape tensors on the host",
                fix="convert without cuda_graphs (TensorRT sizes such outputs while it runs)",
            )
        stream = torch.cuda.current_stream(runner.device)
        if not runner.context.execute_async_v3(stream.cuda_stream):  # TensorRT's set-up run after a shape change
            raise BuildError("TensorRT failed to run the engine before capturing it", fix="see TensorRT's log above")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            capture = torch.cuda.current_stream(runner.device)
            if not runner.context.execute_async_v3(capture.cuda_stream):
                raise BuildError(
                    "TensorRT could not run the engine under CUDA graph capture",
                    fix="convert without cuda_graphs; see TensorRT's log above for the layer that cannot be captured",
                )
        inputs_by_name = {name: keep_alive[i] for i, name in enumerate(runner.inputs)}
        return CapturedGraph(shapes, inputs_by_name, outputs, graph, keep_alive)
