"""The runtime side of plugins (``converters.register_plugin``): the op's own code behind each plugin node.

- ONNX Runtime: an onnxruntime-extensions Python op per plugin name and input/output dtypes, registered before a
  session is made (:func:`prepare_onnxruntime`); it calls the op on CPU tensors made from the numpy inputs.
- TensorRT: a ``tensorrt.plugin`` (JIT Quickly Deployable Plugin) per plugin, registered before the ONNX parser
  looks it up (:func:`register_tensorrt_plugins`). Its shape function runs the op's fake kernel
  (``converters.plugins.shapes``); its impl wraps TensorRT's buffers as torch CUDA tensors through
  ``__cuda_array_interface__`` (no copy), runs the op on TensorRT's stream and copies each result into TensorRT's
  output buffer (the op allocates its own outputs; that device copy is the one copy).
- Artifacts: :func:`restore_plugins` re-creates the specs an artifact recorded (importing the op's module) and,
  for TensorRT, registers the plugins before the engine is deserialised.

Both registries are process-wide, so every registration here is done once per process and key. The specs come
from the graph: each plugin node made by ``register_plugin`` records the torch op it runs
(``converters.plugins.nodes``), so no table of plugins is kept here or in the converter registries' package.
"""

from __future__ import annotations

import contextlib
import ctypes
import inspect
import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
import torch

from converters.errors import BuildError, ConversionError
from converters.plugins.nodes import node_plugin_id, plugin_nodes
from converters.plugins.shapes import Algebra, evaluate, fake_outputs
from converters.plugins.spec import PluginSpec, spec_for_node
from converters.plugins.spec import restore_plugins as restore_specs

logger = logging.getLogger(__name__)

INSTALL_FIX = "pip install 'torch-trt-pipeline[plugins]' (or: pip install onnxruntime-extensions)"

# -- ONNX Runtime: onnxruntime-extensions Python ops ----------------------------------------------------------------

#: numpy dtype -> onnxruntime-extensions type name. float16 and bfloat16 are missing on purpose: the Python op API
#: of onnxruntime-extensions 0.15 aborts the process on them ("Type float16 not supported by python customops").
_ORT_TYPES = {
    np.dtype(np.float32): "dt_float",
    np.dtype(np.float64): "dt_double",
    np.dtype(np.int8): "dt_int8",
    np.dtype(np.uint8): "dt_uint8",
    np.dtype(np.int16): "dt_int16",
    np.dtype(np.int32): "dt_int32",
    np.dtype(np.int64): "dt_int64",
    np.dtype(np.bool_): "dt_bool",
}
_ORT_ATTRIBUTES = {"int": "dt_int64", "bool": "dt_int64", "float": "dt_float"}  # anything else is a string
_registered_references: set[tuple[str, tuple[np.dtype, ...], tuple[np.dtype, ...]]] = set()
_reference_owners: dict[str, str] = {}  # op_type -> plugin id: one domain holds every plugin name
_registrations = [0]  # how many CPU references this process has registered (see PluginSession)


def extensions() -> Any:
    """The onnxruntime_extensions module, or a BuildError saying what to install."""
    try:
        import onnxruntime_extensions
    except ImportError as exc:
        raise BuildError(
            f"the graph has plugin nodes, and their CPU reference needs onnxruntime-extensions ({exc})",
            fix=INSTALL_FIX,
        ) from exc
    return onnxruntime_extensions


def prepare_onnxruntime(model: onnx.ModelProto, options: Any) -> bool:
    """Register the CPU reference of every plugin node of ``model`` and the onnxruntime-extensions library in
    ``options`` (an ``ort.SessionOptions``). False (nothing done) when the graph has no plugin node."""
    nodes = plugin_nodes(model)
    if not nodes:
        return False
    library = extensions().get_library_path()
    types = _element_types(model)
    for node in nodes:
        spec = spec_for_node(node)
        if spec is None:  # a hand-made plugin node: its CPU reference, if any, is the user's own onnx_op
            logger.warning(
                "plugin node %s (%s) has no torch op: ONNX Runtime needs your own CPU reference",
                node.name,
                node_plugin_id(node),
            )
            continue
        unknown = [t for t in (*node.input, *node.output) if t not in types]
        if unknown:
            raise BuildError(
                f"the element types of {', '.join(unknown)} around plugin node {node.name!r} are unknown",
                node=node.name,
                fix="give the plugin's outputs a dtype (register_plugin copies the op's; set it in ctx.plugin users)",
            )
        register_cpu_reference(spec, [types[t] for t in node.input], [types[t] for t in node.output])
    options.register_custom_ops_library(library)
    return True


def register_cpu_reference(spec: PluginSpec, inputs: Sequence[np.dtype], outputs: Sequence[np.dtype]) -> None:
    """An onnxruntime-extensions op ``spec.name`` (domain ai.onnx.contrib) for these dtypes, calling ``spec.op``."""
    owner = _reference_owners.setdefault(spec.name, spec.plugin_id)
    if owner != spec.plugin_id:
        raise BuildError(
            f"plugins {owner} and {spec.plugin_id} share the name {spec.name!r}; ONNX Runtime keeps all plugin "
            "CPU references in one domain, by name",
            fix="pass another name= to register_plugin for one of them",
        )
    key = (spec.name, tuple(inputs), tuple(outputs))
    if key in _registered_references:
        return
    unsupported = sorted({str(d) for d in (*inputs, *outputs) if d not in _ORT_TYPES})
    if unsupported:
        raise BuildError(
            f"plugin {spec.plugin_id} has {', '.join(unsupported)} inputs or outputs, which the onnxruntime-"
            "extensions Python op API cannot take",
            fix="run the plugin's inputs and outputs in float32 on ONNX Runtime (precision='fp32'); TensorRT takes "
            "any dtype",
        )
    ortx = extensions()
    declared = ortx.PyCustomOpDef
    ortx.onnx_op(
        op_type=spec.name,
        inputs=[getattr(declared, _ORT_TYPES[d]) for d in inputs],
        outputs=[getattr(declared, _ORT_TYPES[d]) for d in outputs],
        attrs={name: getattr(declared, _ORT_ATTRIBUTES.get(kind, "dt_string")) for name, kind in spec.attributes},
    )(_reference(spec, list(outputs)))
    _registered_references.add(key)
    _registrations[0] += 1
    logger.info("CPU reference for plugin %s registered (%s -> %s)", spec.plugin_id, inputs, outputs)


class _Failures:
    """An exception raised inside a CPU reference. onnxruntime-extensions aborts the process when a Python op
    raises, so the reference returns placeholders instead and the session's ``run`` raises this afterwards.

    Kept per thread: ONNX Runtime runs a graph's kernels (the Python ones included) on the thread that called
    ``run``, so a failure belongs to the call of that thread, not to another thread's call running at the same
    time."""

    def __init__(self) -> None:
        self._local = threading.local()

    def record(self, exc: BaseException) -> None:
        self._local.first = getattr(self._local, "first", None) or exc

    def take(self) -> BaseException | None:
        first = getattr(self._local, "first", None)
        self._local.first = None
        return first


_failures = _Failures()


def _reference(spec: PluginSpec, outputs: list[np.dtype]) -> Callable[..., Any]:
    def reference(*arrays: np.ndarray, **attrs: Any) -> Any:
        try:
            results = spec.call([torch.from_numpy(np.ascontiguousarray(a)) for a in arrays], spec.decode(attrs))
            _check_results(spec, results, [torch.from_numpy(np.empty(0, d)).dtype for d in outputs])
            arrays_out = [r.detach().cpu().contiguous().numpy() for r in results]
        except Exception as exc:
            _failures.record(exc)
            arrays_out = [np.zeros(0, d) for d in outputs]
        return tuple(arrays_out) if len(arrays_out) > 1 else arrays_out[0]

    reference.__name__ = f"{spec.name}_cpu_reference"
    return reference


def _check_results(spec: PluginSpec, results: Sequence[torch.Tensor], dtypes: Sequence[torch.dtype]) -> None:
    got = [r.dtype for r in results]
    if got != list(dtypes):
        raise ConversionError(
            f"{spec.torch_op} returned {got}; its fake kernel (and so the plugin node) says {list(dtypes)}",
            node=spec.name,
            fix="make the op return the dtypes its register_fake kernel declares (or fix the fake kernel)",
        )


class PluginSession:
    """An ``ort.InferenceSession`` for a graph with plugin nodes, made by ``create`` and remade when needed.

    onnxruntime-extensions gives ONNX Runtime raw pointers into a ``std::vector`` of its Python ops, and the vector
    moves when an op is added: a session made before a registration would then call through dangling pointers
    when it runs and when it is destroyed (a segfault, seen here with onnxruntime-extensions 0.15.2). So a session
    older than the last registration is remade before use, and the old one is never destroyed (a deliberate leak).
    ``run`` also raises what a plugin's CPU reference raised, as it was raised.
    """

    def __init__(self, create: Callable[[], Any]) -> None:
        self._create = create
        self._session = create()
        self._generation = _registrations[0]
        self._remaking = threading.Lock()  # two threads never remake it at once

    def _current(self) -> Any:
        if self._generation != _registrations[0]:
            with self._remaking:
                if self._generation != _registrations[0]:
                    logger.info("remaking an ONNX Runtime session: plugin CPU references were registered since")
                    _leak(self._session)
                    self._session = self._create()
                    self._generation = _registrations[0]
        return self._session

    def __getattr__(self, name: str) -> Any:
        return getattr(self._current(), name)

    def run(self, *args: Any, **kwargs: Any) -> Any:
        """Run the session; an exception raised inside a plugin's CPU reference comes back as itself."""
        session = self._current()
        _failures.take()
        try:
            result = session.run(*args, **kwargs)
        except Exception as exc:
            failure = _failures.take()
            if failure is not None:
                raise failure from exc
            raise
        failure = _failures.take()
        if failure is not None:
            raise failure
        return result

    def __del__(self) -> None:
        if "_session" in self.__dict__ and self._generation != _registrations[0]:
            _leak(self._session)


def _leak(session: Any) -> None:
    # an extra reference that is never released: not even interpreter shutdown destroys the session
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(session))


def _element_types(model: onnx.ModelProto) -> dict[str, np.dtype]:
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception as exc:  # best effort: declared value_info is enough for our own plugin nodes
        logger.info("shape inference failed (%s); plugin element types come from the declared value_info", exc)
        inferred = model
    graph = inferred.graph
    types = {
        v.name: np.dtype(onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type))
        for v in (*graph.input, *graph.output, *graph.value_info)
        if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type
    }
    types |= {t.name: np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type)) for t in graph.initializer}
    return types


# -- TensorRT: tensorrt.plugin ----------------------------------------------------------------------------------------

_registered_plugins: dict[str, str] = {}  # plugin id -> the torch op its tensorrt.plugin runs


def register_tensorrt_plugins(model: onnx.ModelProto) -> list[str]:
    """Register a ``tensorrt.plugin`` for every plugin node of ``model`` made by ``register_plugin``; returns the
    plugin ids. Call before TensorRT parses the graph or deserialises an engine built from it."""
    registered = []
    nodes: dict[str, onnx.NodeProto] = {}
    for node in plugin_nodes(model):
        nodes.setdefault(node_plugin_id(node), node)
    for plugin_id, node in nodes.items():
        spec = spec_for_node(node)
        if spec is None:
            logger.info("plugin %s has no torch op: load its plugin library before the build", plugin_id)
            continue
        register_tensorrt_plugin(spec)
        registered.append(plugin_id)
    return registered


def register_tensorrt_plugin(spec: PluginSpec) -> None:
    """``trtp.register`` (shape function from the fake kernel) and ``trtp.impl`` (the op) for ``spec``, once."""
    import tensorrt.plugin as trtp

    known = _registered_plugins.get(spec.plugin_id)
    if known == spec.torch_op:
        return
    if known is not None:
        raise BuildError(
            f"tensorrt.plugin {spec.plugin_id} already runs torch op {known} in this process; cannot also run "
            f"{spec.torch_op} (TensorRT's plugin registry is process-wide)",
            fix="pass another name= (or namespace=) to one of the register_plugin calls",
        )
    namespace = getattr(trtp.op, spec.namespace, None)
    if namespace is not None and spec.name in vars(namespace):  # the user registered this plugin by hand
        logger.info("tensorrt.plugin %s is already registered; keeping it", spec.plugin_id)
    else:
        trtp.register(spec.plugin_id)(describe_function(spec))
        trtp.impl(spec.plugin_id)(impl_function(spec))
        logger.info("tensorrt.plugin %s registered for %s", spec.plugin_id, spec.torch_op)
    _registered_plugins[spec.plugin_id] = spec.torch_op


_POSITIONAL = inspect.Parameter.POSITIONAL_OR_KEYWORD  # how tensorrt.plugin wants every parameter

#: Attribute kind -> the annotation tensorrt.plugin decodes it with. The parser hands INT over as an int32 field
#: and FLOAT as a float32 one, each of one element; TensorRT 10's QDP turns such a field into an ``int``/``float``
#: with ``int(array)``, which numpy 2 refuses, so numbers are taken as one-element arrays (both majors read those
#: alike). bool travels as INT 0/1, lists as JSON strings; ``spec.decode`` makes them the op's arguments.
_TRT_ATTRIBUTE_TYPES: dict[str, Any] = {
    "int": npt.NDArray[np.int32],
    "bool": npt.NDArray[np.int32],
    "float": npt.NDArray[np.float32],
}


def _attribute_parameters(spec: PluginSpec) -> list[inspect.Parameter]:
    return [
        inspect.Parameter(name, _POSITIONAL, annotation=_TRT_ATTRIBUTE_TYPES.get(kind, str))
        for name, kind in spec.attributes
    ]


def describe_function(spec: PluginSpec) -> Callable[..., Any]:
    """The ``trtp.register`` function of ``spec``: tensors, then attributes, fully annotated; returns one
    ``TensorDesc`` per output, dtypes and shapes from the fake kernel."""
    import tensorrt.plugin as trtp

    def describe(*descs: Any, **attrs: Any) -> Any:
        from pipeline.runtime.tensorrt.runner import torch_dtype, trt_dtype

        dims = [[_known_dim(e) for e in d.shape_expr] for d in descs]
        outputs, symbols = fake_outputs(spec, [torch_dtype(d.dtype) for d in descs], dims, spec.decode(attrs))
        values = {symbol: descs[i].shape_expr[axis] for symbol, (i, axis) in symbols.items()}
        algebra = Algebra(constant=trtp.ShapeExpr, max=trtp.max, min=trtp.min, cdiv=trtp.cdiv)
        result = tuple(
            trtp.from_shape_expr(tuple(evaluate(s, values, algebra) for s in o.sizes), dtype=trt_dtype(o.dtype))
            for o in outputs
        )
        return result if len(result) > 1 else result[0]

    tensors = [inspect.Parameter(n, _POSITIONAL, annotation=trtp.TensorDesc) for n in spec.tensor_args]
    returns = trtp.TensorDesc if spec.num_outputs == 1 else _tuple_of(trtp.TensorDesc, spec)
    describe.__signature__ = inspect.Signature([*tensors, *_attribute_parameters(spec)], return_annotation=returns)  # type: ignore[attr-defined]
    describe.__name__ = f"{spec.name}_describe"
    return describe


def _tuple_of(cls: type, spec: PluginSpec) -> Any:
    return tuple.__class_getitem__((cls,) * spec.num_outputs)


def _known_dim(expr: Any) -> int | None:
    """A build-time constant dim, or None (dynamic; or a placeholder when TensorRT asks for dtypes only)."""
    if expr.is_fake or not expr.is_constant:
        return None
    return int(expr.constant_value())


def impl_function(spec: PluginSpec) -> Callable[..., None]:
    """The ``trtp.impl`` function of ``spec``: named ``(tensors..., attributes..., outputs, stream)`` as
    tensorrt.plugin requires; every attribute is taken, so all of them are serialised into the engine."""
    import tensorrt.plugin as trtp

    names = [name for name, _ in spec.attributes]
    count = len(spec.tensor_args)

    def run(*args: Any, stream: int) -> None:
        tensors, values, outputs = args[:count], args[count : count + len(names)], args[count + len(names)]
        with on_stream(stream):
            results = spec.call([as_torch(t) for t in tensors], spec.decode(dict(zip(names, values, strict=True))))
            targets = [as_torch(o) for o in outputs]
            _check_results(spec, results, [t.dtype for t in targets])
            for target, result in zip(targets, results, strict=True):
                target.copy_(result)

    parameters = [
        *(inspect.Parameter(n, _POSITIONAL, annotation=trtp.Tensor) for n in spec.tensor_args),
        *_attribute_parameters(spec),
        # tensorrt.plugin checks every member of the tuple is a Tensor class: one per output, no Ellipsis
        inspect.Parameter("outputs", _POSITIONAL, annotation=_tuple_of(trtp.Tensor, spec)),
        inspect.Parameter("stream", _POSITIONAL, annotation=int),
    ]
    run.__signature__ = inspect.Signature(parameters, return_annotation=None)  # type: ignore[attr-defined]
    run.__name__ = f"{spec.name}_impl"
    return run


def as_torch(tensor: Any) -> torch.Tensor:
    """A TensorRT plugin tensor as a torch CUDA tensor on the same memory (``__cuda_array_interface__``)."""
    return torch.as_tensor(tensor, device="cuda")


@contextlib.contextmanager
def on_stream(stream: int) -> Iterator[None]:
    """Launch torch work on TensorRT's stream, so it is ordered with the engine's own layers."""
    with torch.cuda.stream(torch.cuda.ExternalStream(stream)):
        yield


# -- artifacts ------------------------------------------------------------------------------------------------------


def restore_plugins(records: Sequence[Mapping[str, Any]], model: onnx.ModelProto, backend: str) -> list[PluginSpec]:
    """Re-create the plugin specs an artifact recorded (importing the modules that define their ops); for TensorRT,
    register the plugins before the engine is deserialised (a JIT plugin runs Python: its impl must exist in the
    loading process). ONNX Runtime's CPU references are registered by the executor, from the graph's nodes."""
    specs = restore_specs(records, model)
    if backend == "tensorrt":
        register_tensorrt_plugins(model)
    return specs
