"""The ONNX Runtime executor: the default backend, and the reference executor for every graph we produce."""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx.external_data_helper import ExternalDataInfo

from converters.errors import BuildError, InputError
from converters.plugins.nodes import plugin_nodes
from passes.model_io.external_data import (
    external_bytes,
    external_tensors,
    ort_session_bytes,
    weights_dir,
    without_weights_dir,
)
from passes.model_io.weightless import weightless
from pipeline.runtime.io_spec import IOSpec
from pipeline.runtime.ort.aliased_cache import AliasedCacheSession, cache_pairs
from pipeline.runtime.ort.int4 import configure_int4
from pipeline.runtime.ort.prepacking import PrepackingSession
from pipeline.settings import Settings

#: The weights each session reads in place (``add_external_initializers``), kept while the session lives.
_HANDED_OVER: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()


class OnnxRuntimeExecutor:
    """The final graph in an ONNX Runtime session (with the float32 emulation of a half graph on the CPU, and plugin CPU
    references).

    A float32 generation step whose weights are prepacked (:func:`float_generation_step`, ``ort_prepack_weights``
    not False) gets its session in two stages (:class:`~pipeline.runtime.ort.prepacking.PrepackingSession`): the
    graph unprepacked now, which every call runs on until the prepacked session, made in a background thread, is
    ready. ``ort_prepack_weights=False``: one unprepacked session, never prepacked. ``ort_row_session=True``: the
    unprepacked session is kept for single-row, single-token steps (:meth:`row_session`) after the switch; False
    (the default): it is dropped then, and every call runs prepacked."""

    backend = "onnxruntime"

    def __init__(
        self, model: onnx.ModelProto, io: IOSpec, settings: Settings, *, prepared: onnx.ModelProto | None = None
    ) -> None:
        # the graph the session runs: a half graph on the CPU runs as its float32 emulation, and so on; ``prepared``:
        # that graph already made (an artifact's stored session graph, pipeline.runtime.ort.stored_graph)
        graphs = prepared_graphs(prepared, settings) if prepared is not None else session_graphs(model, settings)
        #: does the session run a graph made before (``prepared``) rather than one rewritten here?
        self.stored_graph = prepared is not None
        model, prepack, plugins = graphs.runnable, graphs.prepack, graphs.plugins
        if plugins:  # imported only for such a graph: the plugin machinery costs 0.3-1 s of imports (sympy)
            from pipeline.runtime.plugins import PluginSession, prepare_onnxruntime

        def create(prepack: bool = prepack) -> ort.InferenceSession:
            options = ort.SessionOptions()
            options.log_severity_level = 3
            if settings.ort_intra_op_threads is not None:
                options.intra_op_num_threads = settings.ort_intra_op_threads
            allow_spinning = settings.ort_allow_spinning
            if allow_spinning is None and settings.generation is not None:
                allow_spinning = False  # a decode loop of small steps: spinning threads take the cores from the rest
            if allow_spinning is not None:
                spinning = "1" if allow_spinning else "0"
                options.add_session_config_entry("session.intra_op.allow_spinning", spinning)
            configure_int4(model, options, settings)  # MatMulNBits at an exact accuracy level
            if plugins:
                prepare_onnxruntime(model, options)  # plugin nodes: their CPU references (onnxruntime-extensions)
            # no cache of ONNX Runtime's optimized graph across processes: measured on a loaded 226 MB Llama step,
            # it saved 0.02-0.03 s per load and cost 1 s of CPU to build once per artifact, settings and machine;
            # prepacking (0.25 s of the session's 0.3 s) cannot be saved in ONNX Runtime 1.32, whose saved prepacked
            # weights are packed again to be found (tests/pipeline/test_session_cache.py; the cache: commit d1102e6)
            graph = graphs.packed() if prepack else model
            weights: dict[str, np.ndarray] = {}
            if not prepack:  # ONNX Runtime reads unpacked weights in place: handed over as arrays, not serialised
                graph, weights = weightless(graph)
            values = [ort.OrtValue.ortvalue_from_numpy(w) for w in weights.values()]
            if weights:
                options.add_external_initializers(list(weights), values)
            session = ort.InferenceSession(
                ort_session_bytes(graph, options, prepack),
                sess_options=options,
                providers=list(settings.ort_providers),
                disabled_optimizers=_disabled_optimizers(model),  # Q/DQ graphs: see pipeline.runtime.ort.int8
            )
            _HANDED_OVER[session] = values  # the session reads their memory: they live as long as it does
            pairs = cache_pairs(model)  # a grouped-attention step: run() returns the whole cache, as module.onnx
            return AliasedCacheSession(session, pairs) if pairs else session

        #: the unprepacked session that runs a generation step's single-row, single-token steps (``ort_row_session``)
        self._row_session: Any = None
        try:  # a graph with plugin nodes gets a session that is remade when new CPU references appear
            if plugins:
                self.session: Any = PluginSession(create)
            elif graphs.float_step:  # unprepacked now (0.05 s), prepacked in a thread (0.3 s): see PrepackingSession
                interim = create(False)
                self._row_session = interim if graphs.row else None
                self.session = PrepackingSession(interim, lambda: create(True))
            else:
                self.session = create()
        except BuildError:
            raise
        except Exception as exc:
            raise BuildError(
                f"ONNX Runtime could not load the final graph: {exc}",
                fix="run pipeline with validate=False and inspect module.onnx, or check the custom passes",
            ) from exc
        self.input_names = [t.name for t in io.inputs]
        self.output_names = [t.name for t in io.outputs]
        session_inputs = [i.name for i in self.session.get_inputs()]
        if session_inputs != self.input_names:
            raise BuildError(
                f"the session's inputs {session_inputs} differ from the graph's {self.input_names}",
                fix="a pass renamed or removed a graph input; graph inputs must be kept",
            )
        bfloat16 = [o.name for o in self.session.get_outputs() if o.type == "tensor(bfloat16)"]
        if bfloat16:
            raise BuildError(
                f"output(s) {bfloat16} are bfloat16, which the ONNX Runtime backend cannot hand back (numpy has no "
                "bfloat16 type)",
                fix="return float32 from the model (cast after the module), or build for TensorRT "
                "(backend='tensorrt' or 'tensorrt-rtx')",
            )

    def row_session(self) -> Any | None:
        """The session for a generation step of one row and one token (batch-1 decode), or ``None``: the same graph
        without weight prepacking, with its merged projections, when ``settings.ort_row_session`` is on for a
        :func:`float_generation_step` (:func:`row_session_wanted`). It is made when the executor is, as the session
        every call runs on while the prepacked one is made (:class:`PrepackingSession`), and kept for those steps.

        For a single row, MLAS reads a float32 weight faster as it is than in the prepacked layout that every other
        step needs (measured on the issue-35 Llama, one thread: 12.9 ms against 18.3 ms per decode step, while a
        batch of 4 took 48 ms unpacked against 24 ms packed). It maps a loaded artifact's weights (no second copy);
        a converted module's in-memory weights are copied into it once."""
        return self._row_session

    def hold(self, value: Any) -> None:
        """Keep ``value`` (the module's weights directory) alive while a session is made in the background
        (:meth:`~pipeline.runtime.ort.prepacking.PrepackingSession.hold`); nothing to do otherwise."""
        if isinstance(self.session, PrepackingSession):
            self.session.hold(value)

    @property
    def engine_bytes(self) -> bytes | None:
        """None: ONNX Runtime runs the graph itself."""
        return None

    def run(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """Run the session on the flat inputs; the outputs as CPU tensors."""
        feed = {name: _to_numpy(name, t) for name, t in zip(self.input_names, inputs, strict=True)}
        outputs = self.session.run(self.output_names, feed)
        return [torch.from_numpy(np.asarray(o)) for o in outputs]

    def polygraphy_runner(self, name: str) -> Any:
        """Polygraphy's ONNX Runtime runner on the same session."""
        from polygraphy.backend.onnxrt import OnnxrtRunner

        return OnnxrtRunner(self.session, name=name)


@dataclass(frozen=True)
class SessionGraphs:
    """The graphs an executor's sessions run for a final graph (:func:`session_graphs`)."""

    #: ``runnable_model``'s graph: what an unprepacked session runs (the row session's, the first calls')
    runnable: onnx.ModelProto
    #: are the weights prepacked (the main session)?
    prepack: bool
    #: does the graph hold plugin nodes (a session remade when new CPU references appear)?
    plugins: bool
    #: is there a second, unprepacked session for single-row decode steps (:meth:`OnnxRuntimeExecutor.row_session`)?
    row: bool
    #: is it a prepacked float32 generation step (:func:`float_generation_step`)? Its prepacked session runs
    #: :meth:`packed` and is made in a background thread, every call running on ``runnable`` unprepacked until it is
    #: ready (:class:`~pipeline.runtime.ort.prepacking.PrepackingSession`)
    float_step: bool

    def packed(self) -> onnx.ModelProto:
        """What the prepacked session runs: ``runnable``, with a float32 step's merged projections apart (faster
        packed: the issue-35 Llama's 64 tokens 0.678 against 0.765 s at batch 1, 1.019 against 1.099 s at batch 4;
        the unprepacked session keeps them merged: faster unpacked, and made in 0.03 s rather than 0.1-0.2 s, the
        time ONNX Runtime takes to fold the ``Split`` of each merged weight; :mod:`pipeline.runtime.ort.projections`).
        5 ms of Python, made where the prepacked session is made (the background thread)."""
        if not self.float_step:
            return self.runnable
        from pipeline.runtime.ort.projections import split_projections  # (lazy: 5 ms of imports)

        return split_projections(self.runnable)


def session_graphs(model: onnx.ModelProto, settings: Settings) -> SessionGraphs:
    """What :class:`OnnxRuntimeExecutor` runs for ``model``: its ONNX Runtime rewrite
    (:func:`~pipeline.runtime.ort.session_graph.runnable_model`), whether the weights are prepacked, and whether it is
    a float32 generation step (its prepacked graph with the merged projections apart, made in the background).
    The rewrite is deterministic for a graph, the settings and the installed ONNX Runtime, which is what lets an
    artifact store it (:mod:`pipeline.runtime.ort.stored_graph`)."""
    # imported here: the rewrites are 0.1 s of imports that a session of a stored graph does without
    from pipeline.runtime.ort.session_graph import runnable_model

    model = runnable_model(_inline_for_rewrites(model, settings), OnnxRuntimeExecutor.backend, settings)
    return prepared_graphs(model, settings)


def prepared_graphs(prepared: onnx.ModelProto, settings: Settings) -> SessionGraphs:
    """The graphs of ``prepared``, a graph :func:`session_graphs` made (an artifact's stored session graph,
    :func:`~pipeline.runtime.ort.stored_graph.storable_session_graph`, or one just rewritten)."""
    plugins = bool(plugin_nodes(prepared))
    prepack = settings.ort_prepack_weights
    if prepack is None:
        # off for the weights of a large model (mapped, not copied twice); a loaded artifact's graph keeps its
        # weights outside too, whatever their size, and runs as the converted module did: prepacked under the
        # threshold (on this CPU, 1.3x faster decode steps and 1.8x faster prefill of a small Llama)
        prepack = external_bytes(prepared) <= settings.external_data_threshold
    float_step = not plugins and prepack and float_generation_step(prepared, settings)
    return SessionGraphs(prepared, prepack, plugins, float_step and settings.ort_row_session, float_step)


def row_session_wanted(model: onnx.ModelProto, settings: Settings) -> bool:
    """Does a generation step get a second, unprepacked session for its single-row steps
    (:meth:`OnnxRuntimeExecutor.row_session`)? ``settings.ort_row_session`` on (off by default), for a
    :func:`float_generation_step`."""
    return settings.ort_row_session and float_generation_step(model, settings)


def float_generation_step(model: onnx.ModelProto, settings: Settings) -> bool:
    """A generation step on the CPU provider whose matrix products are float32 ``MatMul`` over constant weights:
    its prepacked session runs the merged projections apart, and it may have a row session. 4-bit ``MatMulNBits``
    and the integer kernels of a Q/DQ graph are neither (far slower unpacked: 228 ms against 4.7 ms per int4 decode
    step)."""
    cpu_only = set(settings.ort_providers) <= {"CPUExecutionProvider"}
    if settings.generation is None or not cpu_only:
        return False
    ops = {n.op_type for n in model.graph.node}
    quantized = {"MatMulNBits", "QuantizeLinear", "DequantizeLinear", "MatMulInteger", "QLinearMatMul", "QAttention"}
    weights = {i.name: i.data_type for i in model.graph.initializer}
    float_products = any(
        n.op_type == "MatMul" and weights.get(n.input[1]) == onnx.TensorProto.FLOAT for n in model.graph.node
    )
    return float_products and not (ops & quantized)


def _inline_for_rewrites(model: onnx.ModelProto, settings: Settings) -> onnx.ModelProto:
    """A copy of ``model`` with its external weights read in, when ``runnable_model`` rewrites it (those rewrites read
    initializers from the proto) and the weights are under ``external_data_threshold`` (a loaded artifact keeps them
    all outside; a converted module of that size holds them inline); ``model`` itself otherwise.
    :func:`pipeline.runtime.ort.session_graph.rewrites` says when (one place for ``runnable_model``'s conditions)."""
    from pipeline.runtime.ort.session_graph import rewrites

    rewritten = rewrites(model, settings)
    directory = weights_dir(model)
    if not rewritten or directory is None or external_bytes(model) > settings.external_data_threshold:
        return model
    copy = without_weights_dir(model, always_copy=True)
    for tensor in external_tensors(copy):  # read here: onnx's reader refuses a hard-linked file (the artifact's)
        info = ExternalDataInfo(tensor)
        with open(directory / info.location, "rb") as source:
            source.seek(info.offset or 0)
            tensor.raw_data = source.read(info.length) if info.length is not None else source.read()
        del tensor.external_data[:]
        tensor.data_location = onnx.TensorProto.DEFAULT
    return copy


def _disabled_optimizers(model: onnx.ModelProto) -> list[str]:
    """:func:`pipeline.runtime.ort.int8.disabled_optimizers`, imported only for a graph with Q/DQ nodes, the only
    kind it disables optimizers for: the INT8 rewrites it sits with import graph-surgeon and the emulations (0.1-0.16 s
    of a load's imports)."""
    if not any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in model.graph.node):
        return []
    from pipeline.runtime.ort.int8 import disabled_optimizers

    return disabled_optimizers(model)


def _to_numpy(name: str, tensor: torch.Tensor) -> np.ndarray:
    if tensor.dtype == torch.bfloat16:
        raise InputError(
            f"input {name!r} is bfloat16, which the ONNX Runtime backend cannot take from numpy",
            fix="pass a float32 tensor (precision is set inside the graph, not at the inputs)",
        )
    return tensor.detach().cpu().contiguous().numpy()
