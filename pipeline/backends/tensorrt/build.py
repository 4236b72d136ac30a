"""The TensorRT backend: the final graph parsed and built through Polygraphy's loaders, cached, and run.

Untested without a GPU: nothing here has run on this project's machines. Every TensorRT name it uses is
checked against the real TensorRT 10.16 and 11.4 Python API (tests/pipeline/test_tensorrt_api.py). The graph is
strongly typed (precision is in the ONNX graph), so no precision builder flags are set: TensorRT 11 has none.

Conventions the API conformance test relies on: a variable holding a TensorRT object is annotated with its
class (``parser: trt.OnnxParser = ...``), and code that needs one TensorRT major is guarded with
``if trt_major() >= 11:`` (or ``<``, ``==`` ...); names inside a guard are checked only against the versions
it admits.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnx
import torch

from converters.errors import BuildError
from converters.settings import Settings
from passes.model_io.external_data import base_dir_of
from pipeline.module.io_spec import IOSpec

if TYPE_CHECKING:
    import tensorrt as trt

    from pipeline.backends.tensorrt.runtime import EngineRunner

logger = logging.getLogger(__name__)

#: The static parser check's hook: node name -> why TensorRT's ONNX parser will reject that node. It is asked
#: only when parsing fails, and its reasons are printed beside the parser's own message for each node.
StaticCheck = Callable[[onnx.ModelProto], Mapping[str, str]]

Shape = tuple[int, ...]


def trt_major() -> int:
    """TensorRT's major version; the one form of version check (see the module docstring)."""
    import tensorrt as trt

    return int(trt.__version__.split(".")[0])


def tensorrt_status() -> tuple[bool, str]:
    """Whether TensorRT can build and run here, and why (or why not)."""
    try:
        import tensorrt as trt
    except ImportError as exc:
        return False, f"the tensorrt package does not import ({exc})"
    version = getattr(trt, "__version__", "unknown")
    if trt_major() < 10:
        return False, f"tensorrt {version} is too old: this project supports TensorRT 10 and 11"
    if not torch.cuda.is_available():
        return False, f"tensorrt {version} imports but no CUDA device is present"
    major, minor = torch.cuda.get_device_capability()
    return True, f"tensorrt {version} with CUDA device {torch.cuda.get_device_name()} (sm_{major}{minor})"


def device_identity() -> dict[str, str]:
    """What an engine is tied to: TensorRT version and GPU compute capability."""
    import tensorrt as trt

    major, minor = torch.cuda.get_device_capability()
    return {"tensorrt": trt.__version__, "compute_capability": f"{major}.{minor}"}


def engine_mismatch(built_for: Mapping[str, str], here: Mapping[str, str], settings: Settings) -> str | None:
    """Why an engine built for ``built_for`` cannot run on ``here`` (both from :func:`device_identity`); None if
    it can. Version-compatible engines run on later releases of the same major; ``ampere_plus`` engines on any
    GPU of compute capability 8.0 or later."""
    built_trt, here_trt = built_for.get("tensorrt", "?"), here.get("tensorrt", "?")
    if built_trt != here_trt and not (settings.trt_version_compatible and _later_same_major(built_trt, here_trt)):
        return f"it was built with TensorRT {built_trt}; this machine has {here_trt}"
    built_cc, here_cc = built_for.get("compute_capability", "?"), here.get("compute_capability", "?")
    portable = settings.trt_hardware_compatibility == "ampere_plus" and _version(here_cc)[:1] >= (8,)
    if built_cc != here_cc and not portable:
        return f"it was built for GPU compute capability {built_cc}; this GPU has {here_cc}"
    return None


def profile_shapes(io: IOSpec, settings: Settings) -> dict[str, tuple[Shape, Shape, Shape]]:
    """(min, opt, max) shapes of every input with a declared dynamic dimension; fixed axes keep their size."""
    shapes = {}
    for spec in io.inputs:
        dims = settings.dims_of(spec.name)
        if dims:
            lo, opt, hi = (
                tuple(getattr(dims[a], which) if a in dims else int(s) for a, s in enumerate(spec.shape))
                for which in ("min", "opt", "max")
            )
            shapes[spec.name] = (lo, opt, hi)
    return shapes


def optimization_profile(io: IOSpec, settings: Settings) -> Any:
    """One Polygraphy ``Profile`` from the declared dynamic dimensions (static inputs get their own shape)."""
    from polygraphy.backend.trt import Profile

    profile = Profile()
    for name, (lo, opt, hi) in profile_shapes(io, settings).items():
        profile.add(name, min=lo, opt=opt, max=hi)
    return profile


def build_options(io: IOSpec, settings: Settings) -> dict[str, Any]:
    """Everything besides the graph that changes the engine: part of the engine cache key.

    The optimization profile, and every setting marked ``engine=True`` on its field (``Settings.engine_settings``).
    """
    engine = {k: _jsonable(v) for k, v in settings.engine_settings().items()}
    profile = {name: [list(s) for s in shapes] for name, shapes in profile_shapes(io, settings).items()}
    return {"profile": profile, **engine}


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, (tuple, list)):
        return [_jsonable(v) for v in value]
    return value


def create_config(io: IOSpec, settings: Settings, timing_cache: Path) -> Any:
    """Polygraphy's ``CreateConfig`` for these settings. No precision flags: the graph carries its precision."""
    import tensorrt as trt
    from polygraphy.backend.trt import CreateConfig

    pools = {}
    if settings.trt_workspace_bytes is not None:
        pools[trt.MemoryPoolType.WORKSPACE] = settings.trt_workspace_bytes
    if settings.trt_tactic_shared_memory_bytes is not None:
        pools[trt.MemoryPoolType.TACTIC_SHARED_MEMORY] = settings.trt_tactic_shared_memory_bytes
    hardware = {
        "none": trt.HardwareCompatibilityLevel.NONE,
        "ampere_plus": trt.HardwareCompatibilityLevel.AMPERE_PLUS,
        "same_compute_capability": trt.HardwareCompatibilityLevel.SAME_COMPUTE_CAPABILITY,
    }[settings.trt_hardware_compatibility]
    return CreateConfig(
        tf32=settings.trt_tf32,
        profiles=[optimization_profile(io, settings)],
        memory_pool_limits=pools or None,
        builder_optimization_level=settings.trt_builder_optimization_level,
        hardware_compatibility_level=hardware,
        version_compatible=settings.trt_version_compatible,
        load_timing_cache=str(timing_cache) if timing_cache.is_file() else None,
    )


@dataclass(frozen=True)
class ParseFailure:
    """One error of TensorRT's ONNX parser: the node (name and op type, when it is about a node) and why."""

    node: str
    op: str
    message: str
    code: str


def parse_error(
    failures: Sequence[ParseFailure], model: onnx.ModelProto, static_check: StaticCheck | None
) -> BuildError:
    """The BuildError for a graph the parser rejected: one line per failing node, with the static check's reason."""
    reasons = dict(static_check(model)) if static_check is not None else {}
    lines = []
    for failure in failures:
        where = f"node {failure.node!r} ({failure.op})" if failure.node else "graph"
        line = f"{where}: {failure.message} [{failure.code}]"
        if failure.node in reasons:
            line += f"; static check: {reasons[failure.node]}"
        lines.append(line)
    if not lines:
        lines.append("the parser failed without reporting an error (is the final graph valid ONNX?)")
    return BuildError(
        "TensorRT's ONNX parser rejected the final graph:\n    " + "\n    ".join(lines),
        node=next((f.node for f in failures if f.node), None),
        fix="lower the listed ops with a converter or pass (or register a plugin for them), "
        "or convert with backend='onnxruntime' to run on the CPU",
    )


def parse_network(
    model: onnx.ModelProto, static_check: StaticCheck | None = None, base_dir: Path | None = None
) -> tuple[Any, Any, Any]:
    """(builder, network, parser) for the final graph, strongly typed; keep the tuple alive until the build.

    Polygraphy's ``NetworkFromOnnxBytes`` turns the parser's errors into log lines and a generic exception, so
    the parse is done here, on a network from Polygraphy's ``CreateNetwork``, to report each failing node.
    ``base_dir`` is where external weights live, if the graph has any (default: the pipeline's weights directory).
    """
    import tensorrt as trt
    from polygraphy.backend.trt import CreateNetwork, get_trt_logger

    from pipeline.backends.plugin_runtime import register_tensorrt_plugins

    builder, network = CreateNetwork(strongly_typed=True)()
    trt.init_libnvinfer_plugins(get_trt_logger(), "")
    register_tensorrt_plugins(model)  # the parser finds a plugin node's creator by name: it must exist first
    parser: trt.OnnxParser = trt.OnnxParser(network, get_trt_logger())
    base_dir = base_dir or base_dir_of(model)  # the parser finds external weights beside the path it is given
    parsed = parser.parse(model.SerializeToString(), None if base_dir is None else str(base_dir / "model.onnx"))
    failures = [_parse_failure(parser.get_error(i), model) for i in range(parser.num_errors)]
    if failures or not parsed:
        raise parse_error(failures, model, static_check)
    return builder, network, parser


def _parse_failure(error: trt.ParserError, model: onnx.ModelProto) -> ParseFailure:
    name, op, index = error.node_name(), error.node_operator(), error.node()
    if not name and 0 <= index < len(model.graph.node):
        name, op = model.graph.node[index].name, model.graph.node[index].op_type
    return ParseFailure(node=name, op=op, message=error.desc(), code=error.code().name)


def build_engine(
    model: onnx.ModelProto,
    io: IOSpec,
    settings: Settings,
    timing_cache: Path,
    static_check: StaticCheck | None = None,
) -> bytes:
    """Serialized engine for the final graph; the timing cache is loaded from and merged back into ``timing_cache``."""
    return engine_from_network(parse_network(model, static_check), io, settings, timing_cache)


def engine_from_network(network: tuple[Any, Any, Any], io: IOSpec, settings: Settings, timing_cache: Path) -> bytes:
    """Serialized engine for a parsed ``(builder, network, parser)``; see :func:`build_engine`."""
    from polygraphy.backend.trt import EngineBytesFromNetwork

    timing_cache.parent.mkdir(parents=True, exist_ok=True)
    config = create_config(io, settings, timing_cache)
    try:
        engine = EngineBytesFromNetwork(network, config, save_timing_cache=str(timing_cache))()
    except Exception as exc:
        raise BuildError(
            f"TensorRT could not build an engine from the final graph: {exc}",
            fix="read TensorRT's log above for the failing layer; raise trt_workspace_bytes if it ran out of "
            "memory, or convert with backend='onnxruntime'",
        ) from exc
    return bytes(engine)


def timing_cache_path(settings: Settings) -> Path:
    """The timing cache file: ``trt_timing_cache``, else the engine cache's one for this TensorRT and GPU."""
    from pipeline.backends.tensorrt.engine_cache import EngineCache

    if settings.trt_timing_cache:
        return Path(settings.trt_timing_cache)
    return EngineCache(settings.cache_dir).timing_cache_path(device_identity())


def network_tensors(network: trt.INetworkDefinition) -> dict[str, trt.ITensor]:
    """Every tensor a layer of the parsed network produces, by name: what can be marked as an output. An ONNX
    tensor the parser fused away or removed (an Identity, a folded constant) is not among them."""
    tensors = {}
    for index in range(network.num_layers):
        layer: trt.ILayer = network.get_layer(index)
        for position in range(layer.num_outputs):
            tensor: trt.ITensor | None = layer.get_output(position)
            if tensor is not None:  # an omitted optional output
                tensors[tensor.name] = tensor
    return tensors


def mark_outputs(network: trt.INetworkDefinition, names: Sequence[str]) -> None:
    """Make the named tensors (which the network must have) its only outputs, as Polygraphy's
    ``ModifyNetworkOutputs`` does; that one fails on a name the network lacks, so it is not used."""
    tensors = network_tensors(network)
    for old in [network.get_output(i) for i in range(network.num_outputs)]:
        network.unmark_output(old)
    for name in names:
        network.mark_output(tensors[name])


class MarkedOutputEngines:
    """The final graph parsed once, and engines built from it with chosen tensors as the only outputs (for the
    per-layer comparison). Marked outputs stop fusions across them, so these are not the production engine."""

    def __init__(self, model: onnx.ModelProto, io: IOSpec, settings: Settings) -> None:
        self.io, self.settings = io, settings
        self._parsed = parse_network(model)  # (builder, network, parser): kept alive across the builds
        self._timing_cache = timing_cache_path(settings)

    def tensor_names(self) -> list[str]:
        network: trt.INetworkDefinition = self._parsed[1]
        return list(network_tensors(network))

    def build(self, names: Sequence[str]) -> bytes:
        network: trt.INetworkDefinition = self._parsed[1]
        mark_outputs(network, names)
        return engine_from_network(self._parsed, self.io, self.settings, self._timing_cache)


class TensorRTExecutor:
    """An engine and the runner that executes it on torch CUDA tensors (see ``pipeline.backends.tensorrt.runtime``)."""

    backend = "tensorrt"

    def __init__(self, engine: bytes, io: IOSpec, settings: Settings, cache_status: str = "not cached") -> None:
        from pipeline.backends.tensorrt.runtime import EngineRunner

        self._engine_bytes = engine
        self.cache_status = cache_status
        self.input_names = [t.name for t in io.inputs]
        self.output_names = [t.name for t in io.outputs]
        self._runner: EngineRunner = EngineRunner(engine, allow_host_code=settings.trt_version_compatible)
        self._runner.check_io(io)

    @classmethod
    def build(
        cls, model: onnx.ModelProto, io: IOSpec, settings: Settings, static_check: StaticCheck | None = None
    ) -> TensorRTExecutor:
        """Build the engine, or take it from the engine cache (``settings.cache_dir``) when it was built before."""
        from pipeline.backends.tensorrt.engine_cache import EngineCache, cache_key, graph_digest

        device = device_identity()
        cache = EngineCache(settings.cache_dir)
        timing = timing_cache_path(settings)

        def build() -> bytes:
            return build_engine(model, io, settings, timing, static_check)

        if not settings.trt_engine_cache:
            return cls(build(), io, settings)
        key = cache_key(graph_digest(model), device, build_options(io, settings))
        try:
            result = cache.get_or_build(key, build)
        except OSError as exc:
            raise BuildError(
                f"the engine cache in {cache.directory} cannot be used: {exc}",
                fix="set PIPELINE_CACHE_DIR to a writable directory, or pass trt_engine_cache=False",
            ) from exc
        logger.info("engine: %s (%s)", result.status, result.path)
        return cls(result.engine, io, settings, cache_status=result.status)

    @property
    def engine_bytes(self) -> bytes | None:
        return self._engine_bytes

    def run(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        outputs = self._runner.run(dict(zip(self.input_names, inputs, strict=True)))
        return [outputs[name] for name in self.output_names]

    def polygraphy_runner(self, name: str) -> Any:
        """Polygraphy's ``TrtRunner`` on the same engine (its own execution context), for validation."""
        from polygraphy.backend.trt import TrtRunner

        return TrtRunner(self._runner.engine, name=name)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".") if p.isdigit())


def _later_same_major(built: str, here: str) -> bool:
    b, h = _version(built), _version(here)
    return bool(b) and b[:1] == h[:1] and h >= b
