"""Running a grouped-attention step (:mod:`pipeline.runtime.ort.grouped_attention`) so that it returns what
``module.onnx`` returns: each cache output bound to a copy of its cache input, which ``GroupQueryAttention`` updates
in place."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx


def cache_pairs(model: onnx.ModelProto) -> list[tuple[str, str]]:
    """``(past input, present output)`` of each cache buffer a ``GroupQueryAttention`` node of ``model`` updates."""
    inputs = {i.name for i in model.graph.input}
    outputs = {o.name for o in model.graph.output}
    pairs = []
    for node in model.graph.node:
        if node.op_type == "GroupQueryAttention" and node.domain == "com.microsoft":
            for past, present in ((node.input[3], node.output[1]), (node.input[4], node.output[2])):
                if past in inputs and present in outputs:
                    pairs.append((past, present))
    return pairs


class AliasedCacheSession:
    """An ONNX Runtime session of a grouped-attention step whose ``run`` returns what ``module.onnx`` returns.

    ``GroupQueryAttention`` writes the new positions into ``present`` and copies nothing past the filled length when
    ``present`` is another buffer than ``past``: those positions would be uninitialised memory. ``run`` therefore
    copies each ``past`` input into a fresh buffer, binds the matching ``present`` output to that same buffer, and
    runs in place: ``present`` is the whole cache with the step's positions written, as ``TensorScatter`` gives it
    (one copy of the cache per call, as ``TensorScatter`` makes). Everything else (``io_binding``, the decode
    runners' in-place buffers, ``get_inputs``...) is the session's own."""

    def __init__(self, session: Any, pairs: list[tuple[str, str]]) -> None:
        self._session = session
        self._present = dict(pairs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)

    def run(self, output_names: list[str] | None, input_feed: dict[str, Any], run_options: Any = None) -> list[Any]:
        """``InferenceSession.run`` with the cache outputs aliased to copies of the cache inputs."""
        import onnxruntime as ort

        names = list(output_names) if output_names else [o.name for o in self._session.get_outputs()]
        if _rows_apart(input_feed):  # the kernel takes several new tokens over a past for one row only
            rows = [self.run(names, _row(input_feed, row), run_options) for row in range(len(input_feed["input_ids"]))]
            return [np.concatenate(parts) for parts in zip(*rows, strict=True)]
        binding = self._session.io_binding()
        caches: dict[str, tuple[np.ndarray, Any]] = {}
        for name, value in input_feed.items():
            if name in self._present:
                buffer = np.array(value, copy=True, order="C")
                cache = ort.OrtValue.ortvalue_from_numpy(buffer)
                binding.bind_ortvalue_input(name, cache)
                caches[self._present[name]] = (buffer, cache)
            else:
                binding.bind_cpu_input(name, np.ascontiguousarray(value))
        rest = [name for name in names if name not in caches]
        for name in rest:  # bound first: the first len(rest) outputs of the binding
            binding.bind_output(name)
        for present, (_, cache) in caches.items():
            binding.bind_ortvalue_output(present, cache)
        self._session.run_with_iobinding(binding, run_options)
        values = binding.get_outputs()
        produced = {name: values[i].numpy() for i, name in enumerate(rest)}
        return [caches[name][0] if name in caches else produced[name] for name in names]


def _rows_apart(feed: dict[str, Any]) -> bool:
    """Several rows, several new tokens and a filled past: a call ``GroupQueryAttention`` takes row by row."""
    ids, past = feed.get("input_ids"), feed.get("past_length")
    if ids is None or past is None:
        return False
    shape = np.shape(ids)
    return len(shape) == 2 and shape[0] > 1 and shape[1] > 1 and int(np.asarray(past)) > 0


def _row(feed: dict[str, Any], row: int) -> dict[str, Any]:
    """Row ``row`` of every batched input (``past_length`` is the same for all rows)."""
    return {name: value if name == "past_length" else np.asarray(value)[row : row + 1] for name, value in feed.items()}
