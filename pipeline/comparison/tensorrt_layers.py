"""Per-layer comparison on TensorRT: the engine's own intermediates against PyTorch's module outputs.

For each chunk of matched tensors (the chunking of :func:`pipeline.comparison.layers.chunk_matches`), an engine is
built from the final graph, parsed once, with exactly the chunk's tensors marked as network outputs, and run with
Polygraphy's ``TrtRunner`` on the same inputs. A tensor the parsed network does not have (TensorRT's parser fused
or removed the node that made it) cannot be marked: its module is reported unmatched with that reason.

Marking a tensor as an output keeps it in memory, so TensorRT cannot fuse across it and may choose other tactics:
the per-layer engines are not the production engine, and a divergence that only the production engine shows can
hide here (its outputs are compared with PyTorch in the same report). Untested without a GPU: the TensorRT calls
are in :mod:`pipeline.backends.tensorrt.build` (``MarkedOutputEngines``); what is here runs without TensorRT.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from typing import Any

import onnx

from pipeline.comparison.layers import LayerMatch
from pipeline.runtime.io_spec import IOSpec
from pipeline.settings import Settings

logger = logging.getLogger(__name__)

FUSED = "fused or removed by TensorRT"
NOTE = (
    "TensorRT engines of the final graph built with each chunk's tensors marked as outputs; marking outputs "
    "stops TensorRT from fusing across them (and can change its tactics), so these engines are not the "
    "production engine, whose outputs are compared above"
)


def split_markable(
    matches: Sequence[LayerMatch], network_tensors: Collection[str]
) -> tuple[list[LayerMatch], list[tuple[str, str, str]]]:
    """The matches whose tensor the parsed network has (in order), and the others as unmatched rows
    ``(module, type, reason)``: TensorRT's parser fused or removed the node that made the tensor.

    >>> kept, unmatched = split_markable(matches, {"/blocks.0/Add_output_0"})  # doctest: +SKIP
    """
    have = set(network_tensors)
    kept = [m for m in matches if m.tensor in have]
    unmatched = [(m.module, m.type_name, f"{FUSED} (tensor {m.tensor})") for m in matches if m.tensor not in have]
    return kept, unmatched


class TensorRTLayers:
    """The :class:`pipeline.comparison.layers.LayerBackend` on TensorRT. Parses the final graph on creation (a
    ``BuildError`` names the nodes the parser rejects); builds one engine per chunk."""

    name = "tensorrt"
    note = NOTE

    def __init__(self, final: onnx.ModelProto, io: IOSpec, settings: Settings) -> None:
        from pipeline.backends.tensorrt.build import MarkedOutputEngines

        self._engines = MarkedOutputEngines(final, io, settings)

    def markable(self, matches: Sequence[LayerMatch]) -> tuple[list[LayerMatch], list[tuple[str, str, str]]]:
        """The matches whose tensors exist in the parsed network, and the rest with the reason."""
        kept, unmatched = split_markable(matches, self._engines.tensor_names())
        if unmatched:
            logger.info("per-layer on TensorRT: %d matched tensor(s) are not in the parsed network", len(unmatched))
        return kept, unmatched

    def runner(self, tensors: Sequence[tuple[str, str]]) -> Any:
        """A TensorRT runner of an engine built with ``tensors`` marked as outputs."""
        from polygraphy.backend.trt import EngineFromBytes, TrtRunner

        engine = self._engines.build([name for name, _ in tensors])
        # A loader, not an engine: the runner deserializes it when activated and frees it after the chunk.
        return TrtRunner(EngineFromBytes(engine), name="tensorrt-layers")
