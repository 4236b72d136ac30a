"""Moving between ONNX protos and graph-surgeon graphs without losing what graph-surgeon drops.

onnx-graphsurgeon 0.6.1 does not carry a node's ``metadata_props`` (where the torch exporter records the
PyTorch module path of every node). We keep them in a side table keyed by node name and put them back on export;
a node created by a converter or pass is named after the node it replaced (``<orig>/...``), so it inherits the
metadata of that node.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping

import onnx
import onnx_graphsurgeon as gs

from passes.model_io.external_data import attach_weights, spill_constants, weights_dir
from passes.model_io.gc_pause import gc_paused
from passes.model_io.onnx_export import export_onnx
from passes.model_io.onnx_import import import_onnx

NodeMetadata = Mapping[str, Mapping[str, str]]


@gc_paused(promote=True)  # the import builds a graph of live objects: nothing for the collector to free
def to_graph(model: onnx.ModelProto) -> tuple[gs.Graph, dict[str, dict[str, str]]]:
    """Import a model into graph-surgeon and return the node metadata side table.

    Each imported node also carries its metadata as ``node.metadata`` (a plain Python attribute), so passes can
    say which PyTorch module a node came from (:func:`module_path`).
    """
    metadata = {n.name: {p.key: p.value for p in n.metadata_props} for n in model.graph.node if n.metadata_props}
    graph = import_onnx(model)  # gs.import_onnx, faster
    for node in graph.nodes:
        node.metadata = metadata.get(node.name, {})
    attach_weights(graph, model)  # external weights are read from the model's weights directory
    return graph, metadata


def module_path(metadata: Mapping[str, str]) -> str | None:
    """The dotted path of the PyTorch module a node came from (``encoder.layer.3.attention``), if recorded.

    The torch exporter writes ``pkg.torch.onnx.name_scopes`` as a list of scopes ending with the node's own
    name: ``['', 'blocks.0', 'blocks.0.lin', 'linear']`` -> ``blocks.0.lin``; ``''`` is the root module.
    """
    text = metadata.get("pkg.torch.onnx.name_scopes")
    if not text:
        return None
    try:
        scopes = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return None
    if not isinstance(scopes, list) or len(scopes) < 2:
        return None
    return str(scopes[-2])


@gc_paused()
def to_model(graph: gs.Graph, template: onnx.ModelProto, metadata: NodeMetadata) -> onnx.ModelProto:
    """Export a graph, restoring model-level fields of ``template`` and node metadata by name."""
    directory = weights_dir(template)
    if directory is not None:  # a model with external weights: large constants the passes made join them on disk
        spill_constants(graph, directory)
    model = export_onnx(graph)  # gs.export_onnx, faster
    model.ir_version = template.ir_version
    model.producer_name = template.producer_name
    model.producer_version = template.producer_version
    del model.metadata_props[:]
    model.metadata_props.extend(template.metadata_props)
    for node in model.graph.node:
        props = _metadata_for(node.name, metadata)
        if props:
            del node.metadata_props[:]
            for key, value in props.items():
                node.metadata_props.add(key=key, value=value)
    return model


def _metadata_for(name: str, metadata: NodeMetadata) -> Mapping[str, str] | None:
    while name:
        if name in metadata:
            return metadata[name]
        if "/" not in name:
            return None
        name = name.rsplit("/", 1)[0]
    return None
