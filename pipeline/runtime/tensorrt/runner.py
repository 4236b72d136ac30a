"""Run a TensorRT engine on torch CUDA tensors, with the raw TensorRT 10/11 runtime API.

One execution context per engine: input shapes are set on every call and checked against the engine's
optimization profile first, tensor addresses come straight from torch tensors (non-contiguous inputs are made
contiguous), outputs are new torch tensors (data-dependent ones are sized by TensorRT through an
``IOutputAllocator``), and the work is enqueued on the current torch CUDA stream, so it is ordered with the
caller's torch work without a synchronisation.

Calls from several threads take turns on the one context (:meth:`EngineRunner.exclusive`): TensorRT allows contexts
of one engine to run at once only on separate optimization profiles, and an engine has one (two for a generation
step, both used by every request). A turn ends when its work is enqueued, not when it has run: the next turn's
stream waits on an event of the last one, so the GPU runs them in order without the host waiting.

The same code runs TensorRT-RTX engines (``library=TENSORRT_RTX``), whose just-in-time compiled kernels are kept
in a runtime cache file between runs (``pipeline.runtime.tensorrt.rtx``).

Untested without a GPU; its TensorRT names are checked against TensorRT 10.16 and 11.4 like the rest of the
backend (see ``pipeline.backends.tensorrt.build`` for the conventions), and against TensorRT-RTX 1.7.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnx
import torch

from converters.errors import BuildError, InputError
from pipeline.runtime.io_spec import IOSpec
from pipeline.runtime.tensorrt.cuda_graphs import CudaGraphs
from pipeline.runtime.tensorrt.library import TENSORRT, TrtLibrary
from pipeline.runtime.tensorrt.weights import refit_from_graph, set_weight_streaming_budget

if TYPE_CHECKING:
    import tensorrt as trt

Shape = tuple[int, ...]


def _dtype_pairs(library: TrtLibrary = TENSORRT) -> list[tuple[trt.DataType, torch.dtype]]:
    """TensorRT dtype <-> torch dtype. INT4, FP4 and E8M0 are packed or scale types with no torch twin."""
    tensorrt = library.import_module()

    return [
        (tensorrt.DataType.FLOAT, torch.float32),
        (tensorrt.DataType.HALF, torch.float16),
        (tensorrt.DataType.BF16, torch.bfloat16),
        (tensorrt.DataType.FP8, torch.float8_e4m3fn),
        (tensorrt.DataType.INT8, torch.int8),
        (tensorrt.DataType.UINT8, torch.uint8),
        (tensorrt.DataType.INT32, torch.int32),
        (tensorrt.DataType.INT64, torch.int64),
        (tensorrt.DataType.BOOL, torch.bool),
    ]


def torch_dtype(dtype: trt.DataType, library: TrtLibrary = TENSORRT) -> torch.dtype:
    """The torch dtype of a TensorRT (or TensorRT-RTX, with ``library``) data type."""
    for ours, theirs in _dtype_pairs(library):
        if ours == dtype:
            return theirs
    raise BuildError(
        f"the engine has a tensor of TensorRT type {dtype}, which has no torch dtype",
        fix="keep graph inputs and outputs in a torch dtype (cast inside the graph)",
    )


def trt_dtype(dtype: torch.dtype, library: TrtLibrary = TENSORRT) -> trt.DataType:
    """The TensorRT (or TensorRT-RTX, with ``library``) data type of a torch dtype."""
    for ours, theirs in _dtype_pairs(library):
        if theirs == dtype:
            return ours
    raise BuildError(f"torch dtype {dtype} has no TensorRT type", fix="use a float, integer or bool dtype")


class EngineRunner:
    """A deserialized engine and one execution context; ``run`` takes and returns ``{name: tensor}``."""

    def __init__(
        self,
        plan: bytes,
        *,
        allow_host_code: bool = False,
        library: TrtLibrary = TENSORRT,
        runtime_cache: Path | None = None,
        refit_graph: onnx.ModelProto | None = None,
        weight_streaming_budget: int | None = None,
        cuda_graphs: bool = False,
    ) -> None:
        from pipeline.runtime.tensorrt.library import bind_polygraphy

        tensorrt = library.import_module()
        bind_polygraphy(library)
        from polygraphy.backend.trt import get_trt_logger  # one TensorRT logger per process, shared with the build

        self.library = library

        tensorrt.init_libnvinfer_plugins(get_trt_logger(), "")
        self._runtime: trt.Runtime = tensorrt.Runtime(get_trt_logger())
        # A version-compatible engine carries its own lean runtime, which is host code TensorRT must be allowed to run.
        self._runtime.engine_host_code_allowed = allow_host_code
        self.engine: trt.ICudaEngine = self._runtime.deserialize_cuda_engine(plan)
        if self.engine is None:
            raise BuildError(
                "TensorRT could not deserialize the engine (see TensorRT's log above)",
                fix="the engine was built by another TensorRT version or GPU, or is damaged: load the artifact "
                "with rebuild=True, or convert again (with trt_engine_cache=False if it came from the cache)",
            )
        # the engine's weights and their budget are set before any execution context exists (weights.py)
        if refit_graph is not None:
            refit_from_graph(self.engine, refit_graph, library)
        if weight_streaming_budget is not None:
            set_weight_streaming_budget(self.engine, weight_streaming_budget)
        self._runtime_cache = None
        if library.rtx and (runtime_cache is not None or cuda_graphs):
            from pipeline.runtime.tensorrt.rtx import RuntimeCache

            self._runtime_cache = RuntimeCache(self.engine, runtime_cache, cuda_graphs=cuda_graphs)
            self.context: trt.IExecutionContext = self._runtime_cache.create_execution_context()
        else:
            self.context = self.engine.create_execution_context()
        self.device = torch.device("cuda", torch.cuda.current_device())
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.inputs = [n for n in names if self.engine.get_tensor_mode(n) == tensorrt.TensorIOMode.INPUT]
        self.outputs = [n for n in names if self.engine.get_tensor_mode(n) == tensorrt.TensorIOMode.OUTPUT]
        self.dtypes = {n: torch_dtype(self.engine.get_tensor_dtype(n), library) for n in names}
        self.profile = {n: self._profile(n) for n in self.inputs}
        self._on_host = {n: self.engine.is_shape_inference_io(n) for n in self.inputs}  # shape tensors: host memory
        # a shape tensor's (min, max) values in the first profile (settings.shape_tensor_values: the built ones)
        self._values = {
            n: (values[0], values[2])
            for n in self.inputs
            if self._on_host[n] and len(values := self.engine.get_tensor_profile_values(0, n)) == 3
        }
        self._allocator = _make_output_allocator(self.device, library)
        # TensorRT-RTX captures CUDA graphs itself (its runtime config); TensorRT's are captured with torch
        self._graphs = CudaGraphs(self) if cuda_graphs and not library.rtx else None
        self._turn = threading.Lock()  # one call at a time on the context (see the module docstring)
        self._done: torch.cuda.Event | None = None  # the last turn's work, on its stream
        self.active_profile = 0  # the context's optimization profile (changed by select_profile only)

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[torch.cuda.Stream]:
        """The execution context for one call (bind, select a profile, enqueue), then the next caller's: yields the
        caller's current CUDA stream, made to wait on the GPU for the work of the turn before (another thread's stream
        perhaps: the context's scratch memory is reused by every enqueue)."""
        with self._turn, torch.cuda.device(self.device):
            stream = torch.cuda.current_stream(self.device)
            if self._done is not None:
                stream.wait_event(self._done)
            try:
                yield stream
            finally:
                done = torch.cuda.Event()
                done.record(stream)
                self._done = done

    def select_profile(self, index: int, stream: torch.cuda.Stream) -> None:
        """Make ``index`` the context's optimization profile (inside :meth:`exclusive`): a generation step's decode
        profile, or the first for every other call."""
        if index != self.active_profile:
            if not self.context.set_optimization_profile_async(index, stream.cuda_stream):
                raise BuildError(
                    f"TensorRT could not select optimization profile {index} of the engine",
                    fix="see TensorRT's log above; the engine may have been built with fewer profiles",
                )
            self.active_profile = index

    def refit(self, graph: onnx.ModelProto) -> None:
        """Give the engine the weights of ``graph`` (same structure as the one it was built from), in place: the
        execution context stays valid; captured CUDA graphs are dropped (they may hold the old weights' layout)."""
        with self.exclusive():  # no call enqueues while the weights change
            torch.cuda.synchronize(self.device)  # the refitter must not change weights under enqueued work
            refit_from_graph(self.engine, graph, self.library)
            if self._graphs is not None:
                self._graphs = CudaGraphs(self)

    def check_io(self, io: IOSpec) -> None:
        """The engine's inputs and outputs are the graph's: same names, same dtypes. (TensorRT drops graph inputs
        that nothing uses, so the engine may have fewer inputs.)"""
        graph = {t.name: trt_dtype(t.torch_dtype, self.library) for t in (*io.inputs, *io.outputs)}
        engine = {n: self.engine.get_tensor_dtype(n) for n in (*self.inputs, *self.outputs)}
        wrong = [n for n in engine if graph.get(n) != engine[n]] + [t.name for t in io.outputs if t.name not in engine]
        if wrong:
            raise BuildError(
                f"the engine's inputs and outputs do not match the graph's at {wrong}: engine {engine}, graph {graph}",
                fix="the engine was built from another graph: load the artifact with rebuild=True or convert again",
            )

    def run(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Run the engine on named CUDA tensors (on its first optimization profile); the outputs by name. Safe from
        several threads: calls take turns on the context (:meth:`exclusive`)."""
        with self.exclusive() as stream:
            self.select_profile(0, stream)
            if self._graphs is not None:
                return self._graphs.run(inputs)
            # The tensors TensorRT reads must live until the work is enqueued; after that, torch's stream-aware
            # allocator will not hand their memory to anything that runs before this work on the stream.
            keep_alive, outputs = self.bind(inputs)
            if not self.context.execute_async_v3(stream.cuda_stream):
                raise BuildError(
                    "TensorRT failed to run the engine (see TensorRT's log above)",
                    fix="check the inputs; if they are valid, report the TensorRT error",
                )
            for name in self.outputs:
                if name not in outputs:
                    outputs[name] = self._allocated_output(name)
            del keep_alive
            if self._runtime_cache is not None:
                self._runtime_cache.save_if_new(tuple(tuple(inputs[n].shape) for n in self.inputs))
        return outputs

    def serialize(self) -> Any:
        """The engine serialized as it is now (after a refit: with the new weights); a buffer."""
        return self.engine.serialize()

    def bind(self, inputs: dict[str, torch.Tensor]) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
        """Set the input shapes and the addresses of inputs and of new output tensors on the context: the inputs as
        TensorRT reads them (keep them alive until the work is enqueued) and the outputs (data-dependent ones are
        missing: TensorRT allocates them while it runs)."""
        keep_alive = [self._set_input(name, inputs[name]) for name in self.inputs]
        outputs: dict[str, torch.Tensor] = {}
        for name in self.outputs:
            shape = tuple(self.context.get_tensor_shape(name))
            if any(d < 0 for d in shape):  # data-dependent: TensorRT asks the allocator once it knows the size
                self.context.set_output_allocator(name, self._allocator)
            else:
                outputs[name] = torch.empty(shape, dtype=self.dtypes[name], device=self.device)
                self.context.set_tensor_address(name, outputs[name].data_ptr())
        return keep_alive, outputs

    def _set_input(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        lo, opt, hi = self.profile[name]
        shape = tuple(tensor.shape)
        if len(shape) != len(lo) or not all(a <= s <= b for s, a, b in zip(shape, lo, hi, strict=True)):
            raise InputError(
                f"input {name!r} has shape {list(shape)}, outside the engine's optimization profile for it: "
                f"min {list(lo)}, opt {list(opt)}, max {list(hi)}",
                fix="pass a shape within the profile, or convert again with a wider dynamic range for that axis, "
                f"e.g. dynamic={{{name!r}: {{axis: ('name', min, opt, max)}}}}",
            )
        if tensor.dtype != self.dtypes[name]:
            raise InputError(
                f"input {name!r} is {tensor.dtype}, the engine takes {self.dtypes[name]}",
                fix=f"pass a {self.dtypes[name]} tensor",
            )
        tensor = tensor.to(torch.device("cpu") if self._on_host[name] else self.device).contiguous()
        if name in self._values:
            self._check_values(name, tensor)
        if not self.context.set_input_shape(name, shape):
            raise InputError(
                f"TensorRT refused shape {list(shape)} for input {name!r}",
                fix="see TensorRT's log above for the reason",
            )
        self.context.set_tensor_address(name, tensor.data_ptr())
        return tensor

    def _check_values(self, name: str, tensor: torch.Tensor) -> None:
        """A shape tensor's values within those the engine was built for (TensorRT would fail the run unnamed)."""
        lo, hi = self._values[name]
        values = [int(v) for v in tensor.flatten().tolist()]
        if len(values) != len(lo) or not all(a <= v <= b for v, a, b in zip(values, lo, hi, strict=True)):
            raise InputError(
                f"input {name!r} holds {values}, which size tensors in the engine; it was built for {list(lo)}"
                + (f" to {list(hi)}" if list(lo) != list(hi) else ""),
                fix=f"convert again with a sample holding these values, or shape_tensor_values={{{name!r}: [...]}}",
            )

    def _allocated_output(self, name: str) -> torch.Tensor:
        buffer, shape = self._allocator.buffers.pop(name, None), self._allocator.shapes.pop(name, None)
        if buffer is None or shape is None:  # never hand out a buffer TensorRT may have written in an earlier run
            raise BuildError(
                f"TensorRT did not allocate the data-dependent output {name!r} in this run",
                fix="report this with the TensorRT version: the output allocator contract changed",
            )
        dtype = self.dtypes[name]
        return buffer[: math.prod(shape) * dtype.itemsize].view(dtype).reshape(shape)

    def _profile(self, name: str) -> tuple[Shape, Shape, Shape]:
        shape = tuple(self.engine.get_tensor_shape(name))
        if all(d >= 0 for d in shape):
            return shape, shape, shape
        lo, opt, hi = (tuple(dims) for dims in self.engine.get_tensor_profile_shape(name, 0))
        return lo, opt, hi


def _make_output_allocator(device: torch.device, library: TrtLibrary = TENSORRT) -> Any:
    """An ``IOutputAllocator`` handing TensorRT fresh torch memory for each data-dependent output, every run."""
    tensorrt = library.import_module()

    class TorchOutputAllocator(tensorrt.IOutputAllocator):  # type: ignore[name-defined]
        def __init__(self) -> None:
            tensorrt.IOutputAllocator.__init__(self)
            self.buffers: dict[str, torch.Tensor] = {}
            self.shapes: dict[str, Shape] = {}

        def reallocate_output(self, tensor_name: str, memory: int, size: int, alignment: int) -> int:
            # Always new memory: the previous buffer belongs to the caller now. torch's blocks are 512-byte aligned.
            self.buffers[tensor_name] = torch.empty(max(size, 1), dtype=torch.uint8, device=device)
            return int(self.buffers[tensor_name].data_ptr())

        def reallocate_output_async(self, tensor_name: str, memory: int, size: int, alignment: int, stream: int) -> int:
            return self.reallocate_output(tensor_name, memory, size, alignment)  # allocated on the current stream

        def notify_shape(self, tensor_name: str, shape: Any) -> None:
            self.shapes[tensor_name] = tuple(shape)

    return TorchOutputAllocator()
