"""The TensorRT backends: the final graph parsed and built through Polygraphy's loaders, cached, and run.

One build path serves NVIDIA TensorRT (``backend="tensorrt"``) and TensorRT-RTX (``backend="tensorrt-rtx"``): every
function that touches the library takes a :class:`~pipeline.runtime.tensorrt.library.TrtLibrary` (default: TensorRT)
and imports its module. TensorRT-RTX builds ahead of time on a machine without a GPU; its engines run only on the
GPUs it supports, elsewhere the same final graph runs on ONNX Runtime (``pipeline.runtime.tensorrt.executor``).
Parsing uses the library's own API; the builder config and the build go through Polygraphy's loaders, which serve
one library per process (``pipeline.runtime.tensorrt.library.bind_polygraphy``).

With NVIDIA TensorRT nothing here has run on this project's machines (no GPU); with TensorRT-RTX the parse and the
build run here, in the tests. Every TensorRT name it uses is checked against the real TensorRT 10.16 and 11.4 and
TensorRT-RTX 1.7 Python APIs (tests/pipeline/test_tensorrt_api.py). The graph is strongly typed (precision is in the
ONNX graph), so no precision builder flags are set: TensorRT 11 has none.

Conventions the API conformance test relies on: the library's module is ``tensorrt = library.import_module()``
(``import tensorrt as trt`` serves the annotations), a variable holding a TensorRT object is annotated with its
class (``parser: trt.OnnxParser = ...``), and code that needs one TensorRT major is guarded with
``if trt_major() >= 11:`` (or ``<``, ``==`` ...); names inside a guard are checked only against the versions
it admits.
"""

from __future__ import annotations

import functools
import logging
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnx

from converters.errors import ArtifactError, BuildError
from converters.plugins.spec import plugin_nodes
from passes.model_io.external_data import base_dir_of
from passes.model_io.weightless import weightless
from pipeline.backends.tensorrt.shape_inputs import ValueRange, profile_values, with_values
from pipeline.noise import third_party_shown
from pipeline.runtime.io_spec import IOSpec
from pipeline.runtime.tensorrt.identity import build_options, device_identity
from pipeline.runtime.tensorrt.library import (
    TENSORRT,
    TENSORRT_RTX,
    TrtLibrary,
    bind_polygraphy,
    rtx_plugin_error,
    rtx_targets,
)
from pipeline.runtime.tensorrt.profiles import optimization_profiles
from pipeline.settings import Settings

if TYPE_CHECKING:
    import tensorrt as trt


logger = logging.getLogger(__name__)

#: The static parser check's hook: node name -> why TensorRT's ONNX parser will reject that node. It is asked
#: only when parsing fails, and its reasons are printed beside the parser's own message for each node.
StaticCheck = Callable[[onnx.ModelProto], Mapping[str, str]]

Shape = tuple[int, ...]


def create_config(
    io: IOSpec,
    settings: Settings,
    timing_cache: Path | None,
    library: TrtLibrary = TENSORRT,
    shape_values: Mapping[str, ValueRange] | None = None,
) -> Any:
    """Polygraphy's ``CreateConfig`` for these settings (``CreateConfigRTX`` for TensorRT-RTX, with the target compute
    capabilities and no timing cache: one would make the CPU-only build query a GPU). No precision flags: the graph
    carries its precision. ``shape_values``: the (min, opt, max) values of the network's shape-tensor inputs, in every
    profile."""
    tensorrt = library.import_module()
    bind_polygraphy(library)  # before any Polygraphy TensorRT import (the profiles' too)
    from polygraphy.backend.trt import CreateConfig

    profiles = optimization_profiles(io, settings)
    if shape_values:
        profiles = with_values(profiles, shape_values, settings)

    pools = {}
    if settings.trt_workspace_bytes is not None:
        pools[tensorrt.MemoryPoolType.WORKSPACE] = settings.trt_workspace_bytes
    if settings.trt_tactic_shared_memory_bytes is not None:
        pools[tensorrt.MemoryPoolType.TACTIC_SHARED_MEMORY] = settings.trt_tactic_shared_memory_bytes
    hardware = {
        "none": tensorrt.HardwareCompatibilityLevel.NONE,
        "ampere_plus": tensorrt.HardwareCompatibilityLevel.AMPERE_PLUS,
        "same_compute_capability": tensorrt.HardwareCompatibilityLevel.SAME_COMPUTE_CAPABILITY,
    }[settings.trt_hardware_compatibility]
    if library.rtx:
        return with_weight_flags(_create_config_rtx(settings, pools, profiles), settings, library)
    config = CreateConfig(
        tf32=settings.trt_tf32,
        profiles=profiles,
        memory_pool_limits=pools or None,
        builder_optimization_level=settings.trt_builder_optimization_level,
        hardware_compatibility_level=hardware,
        version_compatible=settings.trt_version_compatible,
        load_timing_cache=str(timing_cache) if timing_cache is not None and timing_cache.is_file() else None,
    )
    return with_weight_flags(config, settings, library)


def with_weight_flags(config: Any, settings: Settings, library: TrtLibrary) -> Any:
    """``config`` with the builder flags of the weight options (``pipeline.runtime.tensorrt.weights``), if any."""
    from polygraphy.backend.trt import PostprocessConfig

    from pipeline.runtime.tensorrt.weights import set_weight_flags, weight_flag_names

    if not weight_flag_names(settings):
        return config
    return PostprocessConfig(config, func=lambda builder, network, cfg: set_weight_flags(cfg, settings, library))


def _create_config_rtx(settings: Settings, pools: dict[Any, int], profiles: list[Any]) -> Any:
    """TensorRT-RTX's config: its targets; TF32 set as asked (it is on by default in TensorRT-RTX, and its
    ``CreateConfigRTX`` takes no ``tf32``); no hardware compatibility level (unsupported in TensorRT-RTX)."""
    from polygraphy.backend.tensorrt_rtx import CreateConfigRTX
    from polygraphy.backend.trt import PostprocessConfig

    if settings.trt_hardware_compatibility != "none":
        raise BuildError(
            f"trt_hardware_compatibility={settings.trt_hardware_compatibility!r} does not apply to TensorRT-RTX",
            fix="leave it at 'none': TensorRT-RTX engines target compute capabilities (trt_compute_capabilities)",
        )
    requested = settings.trt_compute_capabilities
    targets = [tuple(int(p) for p in cc.split(".")) for cc in rtx_targets(requested)] if requested else None
    config = CreateConfigRTX(
        profiles=profiles,
        memory_pool_limits=pools or None,
        builder_optimization_level=settings.trt_builder_optimization_level,
        version_compatible=settings.trt_version_compatible or None,
        compute_capabilities=targets,
    )
    tf32 = settings.trt_tf32

    def set_tf32(builder: Any, network: Any, config: trt.IBuilderConfig) -> None:
        flag = TENSORRT_RTX.import_module().BuilderFlag.TF32
        if tf32:
            config.set_flag(flag)
        else:
            config.clear_flag(flag)

    return PostprocessConfig(config, func=set_tf32)


@dataclass(frozen=True)
class ParseFailure:
    """One error of TensorRT's ONNX parser: the node (name and op type, when it is about a node) and why."""

    node: str
    op: str
    message: str
    code: str


def parse_error(
    failures: Sequence[ParseFailure],
    model: onnx.ModelProto,
    static_check: StaticCheck | None,
    library: TrtLibrary = TENSORRT,
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
        f"{library.title}'s ONNX parser rejected the final graph:\n    " + "\n    ".join(lines),
        node=next((f.node for f in failures if f.node), None),
        fix="lower the listed ops with a converter or pass (or register a plugin for them), "
        "or convert with backend='onnxruntime' to run on the CPU",
    )


def parse_network(
    model: onnx.ModelProto,
    static_check: StaticCheck | None = None,
    base_dir: Path | None = None,
    library: TrtLibrary = TENSORRT,
) -> tuple[Any, Any, Any]:
    """(builder, network, parser) for the final graph, strongly typed; keep the tuple alive until the build.

    A graph the parser rejects is a BuildError with one line per failing node (see :func:`parse_onnx`).
    """
    parsed, failures = parse_onnx(model, base_dir, library)
    if failures:
        raise parse_error(failures, model, static_check, library)
    decomposable_attention(parsed[1], library)
    return parsed


def decomposable_attention(network: Any, library: TrtLibrary = TENSORRT) -> int:
    """Mark every attention layer of the parsed ``network`` decomposable (``IAttention.decomposable``, what
    Polygraphy's ``SetDecomposableAttentions`` sets), and return how many there are: the builder then computes one it
    has no dedicated kernel for (a head size, a mask, a dtype: TensorRT-RTX 1.7 refused an fp16 encoder-decoder step's
    masked cross-attention, "Attention operation was not supported by a dedicated kernel") as MatMul, Softmax and
    MatMul in the same precision, and keeps its fused kernel wherever there is one."""
    tensorrt = library.import_module()
    marked = 0
    for index in range(network.num_layers):
        layer = network.get_layer(index)
        if layer.type == tensorrt.LayerType.ATTENTION_INPUT:
            layer.__class__ = tensorrt.IAttentionInputLayer  # the bindings hand back the base class
            layer.attention.decomposable = True
            marked += 1
    return marked


def parse_onnx(
    model: onnx.ModelProto, base_dir: Path | None = None, library: TrtLibrary = TENSORRT, *, for_build: bool = True
) -> tuple[tuple[Any, Any, Any], list[ParseFailure]]:
    """Parse the graph with ``library``'s ONNX parser: ``((builder, network, parser), failures)``, no failures when
    it was accepted.

    Polygraphy's ``NetworkFromOnnxBytes`` turns the parser's errors into log lines and a generic exception, so
    the parse is done here, with the library's own API, to report each failing node; no Polygraphy loader is used,
    so parsing serves TensorRT and TensorRT-RTX in one process (building binds Polygraphy to one, see
    ``pipeline.runtime.tensorrt.library``). ``base_dir`` is where external weights live, if the graph has any
    (default: the pipeline's weights directory). Plugin nodes given to TensorRT-RTX are a BuildError ``for_build``;
    otherwise its parser judges them (it finds no plugin creator).
    """
    tensorrt = library.import_module()
    from pipeline.runtime.plugins import register_tensorrt_plugins

    plugins = plugin_nodes(model)
    if plugins and library.rtx and for_build:
        raise rtx_plugin_error([n.name for n in plugins])
    logger = library_logger(library)
    builder: trt.Builder = tensorrt.Builder(logger)
    network: trt.INetworkDefinition = builder.create_network(
        1 << int(tensorrt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    )
    tensorrt.init_libnvinfer_plugins(logger, "")
    if plugins and not library.rtx:
        register_tensorrt_plugins(model)  # the parser finds a plugin node's creator by name: it must exist first
    holder = _holding_parser(tensorrt)(network, logger)
    parser: trt.OnnxParser = holder
    base_dir = base_dir or base_dir_of(model)  # the parser finds external weights beside the path it is given
    path = None if base_dir is None else str(base_dir / "model.onnx")
    # TensorRT 10.13+ and TensorRT-RTX take the weights in place: a light graph, then each weight by address (the
    # issue-35 Llama step parses in 0.11 s instead of 0.49 s: its 216 MB are neither serialised nor parsed back)
    light, weights = weightless(model) if hasattr(parser, "load_model_proto") else (model, {})
    if weights:
        holder.weights = weights  # read until the parser goes (TensorRT's rule): kept as long as it is
        parsed = (
            parser.load_model_proto(light.SerializeToString(), path)
            and all(parser.load_initializer(name, w.ctypes.data, w.nbytes) for name, w in weights.items())
            and parser.parse_model_proto()
        )
    else:
        parsed = parser.parse(model.SerializeToString(), path)
    failures = [_parse_failure(parser.get_error(i), model) for i in range(parser.num_errors)]
    if not parsed and not failures:
        failures.append(ParseFailure("", "", "the parser failed without reporting an error", "UNKNOWN"))
    return (builder, network, parser), failures


@functools.cache
def _holding_parser(tensorrt: Any) -> Any:
    """``tensorrt.OnnxParser`` with a ``weights`` attribute: the arrays whose memory it reads."""
    return type("WeightHoldingParser", (tensorrt.OnnxParser,), {"weights": None})


def library_logger(library: TrtLibrary = TENSORRT) -> Any:
    """One ``ILogger`` per library and process for parsing, into Python logging (stdout stays the caller's): the
    parser's errors become the per-node report, so they are logged at INFO; internal errors at ERROR."""
    if library.module_name not in _LOGGERS:
        tensorrt = library.import_module()
        severity = tensorrt.ILogger.Severity
        levels = {severity.INTERNAL_ERROR: logging.ERROR, severity.ERROR: logging.INFO, severity.WARNING: logging.INFO}

        class ParserLogger(tensorrt.ILogger):  # type: ignore[name-defined]
            def __init__(self) -> None:
                tensorrt.ILogger.__init__(self)

            def log(self, level: trt.ILogger.Severity, msg: str) -> None:
                python_level = levels.get(level, logging.DEBUG)
                if level == severity.WARNING and not third_party_shown():  # its advice ("Make sure input x has
                    python_level = logging.DEBUG  # Int64 binding") is for TensorRT's users: pipeline -v shows it
                logger.log(python_level, "%s: %s", library.title, msg)

        _LOGGERS[library.module_name] = ParserLogger()
    return _LOGGERS[library.module_name]


_LOGGERS: dict[str, Any] = {}


def _parse_failure(error: trt.ParserError, model: onnx.ModelProto) -> ParseFailure:
    name, op, index = error.node_name(), error.node_operator(), error.node()
    if not name and 0 <= index < len(model.graph.node):
        name, op = model.graph.node[index].name, model.graph.node[index].op_type
    message = error.desc()
    where = f"{error.func()} at {Path(error.file()).name}:{error.line()}" if error.func() else ""
    if where and (len(message) < 20 or message in ("false", "true")):  # a bare check: the checker's name says more
        message = f"{message} ({where})"
    return ParseFailure(node=name, op=op, message=message, code=error.code().name)


def build_engine(
    model: onnx.ModelProto,
    io: IOSpec,
    settings: Settings,
    timing_cache: Path | None,
    static_check: StaticCheck | None = None,
    library: TrtLibrary = TENSORRT,
) -> bytes:
    """Serialized engine for the final graph; the timing cache is loaded from and merged back into ``timing_cache``
    (None: no timing cache, as for TensorRT-RTX)."""
    parsed = parse_network(model, static_check, library=library)
    return engine_from_network(parsed, io, settings, timing_cache, library)


def engine_from_network(
    network: tuple[Any, Any, Any],
    io: IOSpec,
    settings: Settings,
    timing_cache: Path | None,
    library: TrtLibrary = TENSORRT,
) -> bytes:
    """Serialized engine for a parsed ``(builder, network, parser)``; see :func:`build_engine`."""
    config = create_config(io, settings, timing_cache, library, profile_values(network[1], settings))
    from polygraphy.backend.trt import EngineBytesFromNetwork  # bound to ``library`` by create_config

    if timing_cache is not None:
        timing_cache.parent.mkdir(parents=True, exist_ok=True)
    try:
        engine = EngineBytesFromNetwork(
            network, config, save_timing_cache=None if timing_cache is None else str(timing_cache)
        )()
    except Exception as exc:
        from pipeline.runtime.tensorrt.weights import refit_build_error

        refusal = refit_build_error(settings, library)
        if refusal is not None:
            raise refusal from exc
        raise BuildError(
            f"{library.title} could not build an engine from the final graph: {exc}",
            fix=f"read {library.title}'s log above for the failing layer; raise trt_workspace_bytes if it ran out of "
            "memory, or convert with backend='onnxruntime'",
        ) from exc
    return bytes(engine)


def timing_cache_path(settings: Settings, library: TrtLibrary = TENSORRT) -> Path | None:
    """The timing cache file: ``trt_timing_cache``, else the engine cache's one for this TensorRT and GPU. None for
    TensorRT-RTX, whose timing cache has no effect on the engine and would make the build query a GPU."""
    from pipeline.backends.tensorrt.engine_cache import EngineCache

    if library.rtx:
        return None
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
        """Every tensor of the parsed network that can be marked as an output."""
        network: trt.INetworkDefinition = self._parsed[1]
        return list(network_tensors(network))

    def build(self, names: Sequence[str]) -> bytes:
        """An engine of the parsed network with ``names`` marked as outputs."""
        network: trt.INetworkDefinition = self._parsed[1]
        mark_outputs(network, names)
        return engine_from_network(self._parsed, self.io, self.settings, self._timing_cache)


def cached_engine(
    model: onnx.ModelProto,
    io: IOSpec,
    settings: Settings,
    static_check: StaticCheck | None = None,
    library: TrtLibrary = TENSORRT,
) -> tuple[bytes, str]:
    """``(engine, how)``: built, or taken from the engine cache (``settings.cache_dir``) when it was built before.

    The key holds the graph, the library and its version, the GPU (TensorRT) or the target compute capabilities
    (TensorRT-RTX), the optimization profile and every engine setting (``build_options``).
    """
    from pipeline.backends.tensorrt.engine_cache import EngineCache, cache_key, graph_digest

    timing = timing_cache_path(settings, library)
    built: list[bytes] = []

    def build() -> bytes:  # at most once, also when the cache fails after the build
        if not built:
            built.append(build_engine(model, io, settings, timing, static_check, library))
        return built[0]

    if not settings.trt_engine_cache:
        return build(), "not cached"
    cache = EngineCache(settings.cache_dir, settings.trt_engine_cache_size)
    try:
        key = cache_key(graph_digest(model), device_identity(library, settings), build_options(io, settings))
        result = cache.get_or_build(key, build)
    except (OSError, ArtifactError) as exc:  # a cache directory that is a file, read-only, full: no cache, said so
        warnings.warn(
            f"the engine cache in {cache.directory} cannot be used ({exc}); the engine is built without it. "
            "Set PIPELINE_CACHE_DIR (or cache_dir=) to a writable directory, or pass trt_engine_cache=False",
            EngineCacheWarning,
            stacklevel=2,
        )
        return build(), "built (engine cache unusable)"
    logger.info("engine: %s (%s)", result.status, result.path)
    return result.engine, result.status


class EngineCacheWarning(UserWarning):
    """The engine cache could not be used; the conversion went on without it."""
