"""The TensorRT executor, built through Polygraphy's loaders. The only module that imports ``tensorrt``.

Untested without a GPU: nothing here has run on this project's machines. The names it uses are checked against
the real TensorRT 10.16 and 11.4 Python API. The graph is strongly typed (precision is in the ONNX graph), so no
precision builder flags are set: TensorRT 11 has none.
"""

from __future__ import annotations

import logging
from typing import Any

import onnx
import torch

from converters.errors import BuildError
from converters.settings import Settings
from pipeline.io_spec import IOSpec

logger = logging.getLogger(__name__)


def tensorrt_status() -> tuple[bool, str]:
    """Whether TensorRT can build and run here, and why (or why not)."""
    try:
        import tensorrt as trt
    except ImportError as exc:
        return False, f"the tensorrt package does not import ({exc})"
    version = getattr(trt, "__version__", "unknown")
    if not torch.cuda.is_available():
        return False, f"tensorrt {version} imports but no CUDA device is present"
    major, minor = torch.cuda.get_device_capability()
    return True, f"tensorrt {version} with CUDA device {torch.cuda.get_device_name()} (sm_{major}{minor})"


def device_identity() -> dict[str, str]:
    """What an engine is tied to: TensorRT version and GPU compute capability."""
    import tensorrt as trt

    major, minor = torch.cuda.get_device_capability()
    return {"tensorrt": trt.__version__, "compute_capability": f"{major}.{minor}"}


def optimization_profile(io: IOSpec, settings: Settings) -> Any:
    """One Polygraphy ``Profile`` from the declared dynamic dimensions (static inputs get their own shape)."""
    from polygraphy.backend.trt import Profile

    profile = Profile()
    for spec in io.inputs:
        dims = settings.dims_of(spec.name)
        if not dims:
            continue
        lo, opt, hi = (
            tuple(getattr(dims[a], which) if a in dims else int(s) for a, s in enumerate(spec.shape))
            for which in ("min", "opt", "max")
        )
        profile.add(spec.name, min=lo, opt=opt, max=hi)
    return profile


class TensorRTExecutor:
    backend = "tensorrt"

    def __init__(self, engine: bytes, io: IOSpec) -> None:
        from polygraphy.backend.trt import EngineFromBytes, TrtRunner

        self._engine_bytes = engine
        self._engine = EngineFromBytes(engine)()
        self._runner = TrtRunner(self._engine, name="tensorrt")
        self._runner.activate()
        self.input_names = [t.name for t in io.inputs]
        self.output_names = [t.name for t in io.outputs]

    @classmethod
    def build(cls, model: onnx.ModelProto, io: IOSpec, settings: Settings) -> TensorRTExecutor:
        import tensorrt as trt
        from polygraphy.backend.trt import CreateConfig, EngineBytesFromNetwork, NetworkFromOnnxBytes

        pools = {}
        if settings.trt_workspace_bytes is not None:
            pools[trt.MemoryPoolType.WORKSPACE] = settings.trt_workspace_bytes
        network = NetworkFromOnnxBytes(model.SerializeToString(), strongly_typed=True)
        config = CreateConfig(
            profiles=[optimization_profile(io, settings)],
            memory_pool_limits=pools or None,
            builder_optimization_level=settings.trt_builder_optimization_level,
        )
        try:
            engine = EngineBytesFromNetwork(network, config)()
        except Exception as exc:
            raise BuildError(
                f"TensorRT could not parse or build the final graph: {exc}",
                fix="check the graph with the static parser check, or convert with backend='onnxruntime'",
            ) from exc
        return cls(bytes(engine), io)

    @property
    def engine_bytes(self) -> bytes | None:
        return self._engine_bytes

    def run(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        feed = {name: t.cuda().contiguous() for name, t in zip(self.input_names, inputs, strict=True)}
        outputs = self._runner.infer(feed, copy_outputs_to_host=False)
        # TrtRunner reuses its output buffers on the next call: hand the caller its own copies.
        return [outputs[name].clone() for name in self.output_names]

    def polygraphy_runner(self, name: str) -> Any:
        from polygraphy.backend.trt import TrtRunner

        return TrtRunner(self._engine, name=name)
