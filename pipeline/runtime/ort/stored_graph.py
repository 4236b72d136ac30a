"""The ONNX Runtime session graph of an artifact, made when it is saved so that loading it does not make it again.

:func:`~pipeline.runtime.ort.executor.session_graphs` rewrites a final graph for ONNX Runtime's CPU kernels
(``GroupQueryAttention``, the fused norms): 0.1-0.15 s of Python per load of the issue-35 Llama step, the same every
time. :func:`storable_session_graph` makes it once, at save time, from the very graph the artifact holds (its
weights external, in ``model.onnx.data``), and the artifact keeps it as one more small member whose tensors point into
the same weights: no weight is stored twice. It is stored only when it is nothing but a rewrite of the nodes: every
initializer it shares with the graph is the same tensor, and it adds none outside the graph proto (the emulations of
half, FP8, NVFP4 and INT8 graphs make new weights: those are rewritten at load, as before; so are graphs with plugin
nodes). It keeps a generation step's merged projections merged: the unprepacked session a load starts with runs them
so (made in 0.03 s; apart, ONNX Runtime folds a ``Split`` of each merged weight: 0.1-0.2 s more), and the prepacked
one, made in the background (:mod:`pipeline.runtime.ort.prepacking`), splits them first (5 ms of Python).

What the rewrite gives depends on the graph, the settings, the installed ONNX Runtime (which kernels and inputs it
has) and the rewriting code. :func:`session_graph_key` fingerprints the last three (the settings without the
thread choices a load may change, ONNX Runtime's version, the source of this package); a load uses the stored graph
only when its key is this process's, and otherwise rewrites the graph itself, as an artifact without one is loaded.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import onnx

from passes.model_io.external_data import external_tensors, has_weights_dir
from pipeline.settings import Settings

log = logging.getLogger(__name__)
#: The settings a load may change (``pipeline.load(path, threads=, spinning=)``): no part of the graph.
_RUNTIME_FIELDS = ("ort_intra_op_threads", "ort_allow_spinning")


def storable_session_graph(graph: onnx.ModelProto, settings: Settings) -> onnx.ModelProto | None:
    """The graph ONNX Runtime's sessions run for ``graph`` (an artifact's graph: its weights external; a float32
    generation step's merged projections kept merged: its prepacked session splits them at load, in 5 ms,
    :meth:`~pipeline.runtime.ort.executor.SessionGraphs.packed`), when an artifact can store it beside ``graph`` (see
    the module docstring); ``None`` when the session runs ``graph`` as it is or when the rewrite must be made at
    load."""
    # imported here: saving needs the rewrites, a load that checks the key (session_graph_key) does not
    from pipeline.runtime.ort.executor import session_graphs
    from pipeline.runtime.ort.session_graph import rewrites

    if has_weights_dir(graph) or rewrites(graph, settings):
        return None  # a graph reading weights from a directory of this machine; emulations that make new weights
    try:
        graphs = session_graphs(graph, settings)
    except Exception as exc:  # noqa: BLE001 -- whatever fails here fails again at load, where it is reported
        log.info("no session graph stored: rewriting the graph failed (%s); a load will rewrite it", exc)
        return None
    runnable = graphs.runnable
    if runnable is graph or graphs.plugins:
        return None
    return runnable if _same_weights(graph, runnable) else None


def _same_weights(graph: onnx.ModelProto, packed: onnx.ModelProto) -> bool:
    """Does ``packed`` read ``graph``'s external weights as ``graph`` does, and no other external data?"""
    kept = {t.name: t for t in graph.graph.initializer}
    for tensor in external_tensors(packed):
        original = kept.get(tensor.name)
        if original is None or original.SerializeToString() != tensor.SerializeToString():
            return False
    return all(
        kept[t.name].SerializeToString() == t.SerializeToString() for t in packed.graph.initializer if t.name in kept
    )


def session_graph_key(settings: Settings) -> str | None:
    """The fingerprint a stored session graph must have for these settings here: the settings (but the thread
    choices), ONNX Runtime's version and the source of the rewriting code; ``None`` when that source cannot be read
    (nothing is stored, nothing stored is used)."""
    source = _source_fingerprint()
    if source is None:
        return None
    import onnxruntime

    data = dataclasses.asdict(settings)
    for name in (*_RUNTIME_FIELDS, "cache_dir", "trt_timing_cache", "weights_dir"):  # machine paths: not saved
        data.pop(name, None)
    record = {"settings": data, "onnxruntime": onnxruntime.__version__, "source": source}
    return hashlib.sha256(json.dumps(record, sort_keys=True, default=_jsonable).encode()).hexdigest()


def _jsonable(value: Any) -> Any:
    return repr(value)


@functools.cache
def _source_fingerprint() -> str | None:
    """The SHA-256 of this package's modules (the rewrites, the executor that applies them) and of the external-data
    helpers they use; ``None`` when a module's source is not there to read."""
    from passes.model_io import external_data

    here = Path(__file__).parent
    files = [*sorted(here.glob("*.py")), Path(external_data.__file__)]
    digest = hashlib.sha256()
    try:
        for file in files:
            digest.update(file.name.encode())
            digest.update(file.read_bytes())
    except OSError:
        return None
    return digest.hexdigest()
