"""The exported program's weights: their size, written to an external data file when large, the protobuf limit when
kept in memory, and the constants the exporter's optimizer left unregistered."""

from __future__ import annotations

import logging
import time
from typing import Any

import onnx

from converters.errors import ExportError
from passes.model_io.external_data import PROTOBUF_LIMIT, WeightFiles, set_weights_dir
from passes.model_io.weightless import serialized_size
from pipeline.exporting import errors as export_errors

logger = logging.getLogger(__name__)


def restore_lost_initializers(model: Any) -> None:
    """Register the constants the exporter's optimizer left unregistered, in its ONNX IR ``model`` (main graph).

    onnxscript 0.7.2's ``Clip(Clip(x))`` fusion names the fused bounds ``{x}_min``/``{x}_max``; chains sharing ``x``
    (timm's Gemma4 ViT clamps the input of its query, key and value projections between buffers) get ``_1``, ``_2``
    names that are never registered, so the graph reads tensors nothing produces. The values still hold their data:
    registered, the graph is exactly what the optimizer meant. A read of a tensor without data is the exporter's
    error, raised here, before any pass of ours.
    """
    graph = model.graph
    known = {id(v) for v in graph.inputs} | {id(v) for v in graph.initializers.values()}
    lost: list[tuple[str, str]] = []
    for node in graph:
        for value in node.inputs:
            if value is None or value.producer() is not None or id(value) in known:
                continue
            if value.const_value is None or value.name in graph.initializers:
                lost.append((str(node.name), str(value.name)))
                continue
            graph.register_initializer(value)
            known.add(id(value))
            logger.info("registered the exporter's lost constant %s (read by %s)", value.name, node.name)
    if lost:
        raise ExportError(export_errors.dangling_message(lost), node=lost[0][0],
                          fix="report this model to PyTorch (torch.onnx export) with the tensors named")  # fmt: skip


def weight_bytes(program: Any) -> int:
    """Bytes of the exported program's initializers (the ONNX IR refers to the torch tensors: nothing is copied)."""
    return sum(
        value.const_value.nbytes for value in program.model.graph.initializers.values() if value.const_value is not None
    )


def save_external(program: Any, weights: WeightFiles) -> onnx.ModelProto:
    """Write the weights to ``model.onnx.data`` in ``weights`` tensor by tensor, and read back the graph alone."""
    path = weights.directory / "model.onnx"
    start = time.perf_counter()
    try:
        program.save(str(path), external_data=True)
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:
        weights.cleanup()
        raise ExportError(
            f"writing the exported weights to {weights.directory} failed: {type(exc).__name__}: {exc}",
            fix="free disk space there, or pass weights_dir= a directory with room for the model's weights",
        ) from exc
    finally:
        path.unlink(missing_ok=True)  # the graph lives on as a proto; only the data file stays
    set_weights_dir(model, weights.directory)
    logger.debug("weights written to %s in %.2f s", weights.directory, time.perf_counter() - start)
    return model


def check_protobuf_limit(model: onnx.ModelProto) -> None:
    """An in-memory graph over protobuf's 2 GiB limit is an ExportError naming the setting that kept it there."""
    size = serialized_size(model)
    if size > PROTOBUF_LIMIT:
        raise ExportError(
            f"the exported graph is {size / 2**30:.2f} GiB, over protobuf's 2 GiB limit, and was kept in memory "
            "because external_data_threshold is set above the size of its weights",
            fix="leave external_data_threshold at its default (1 GiB) or lower it, so the weights go to an external "
            "data file",
        )
