"""Per-layer comparison on TensorRT: everything up to the TensorRT calls runs here (the name filtering, the chunk
planning, the matching and statistics on intermediates from a backend that lacks some tensors); the engines
themselves only on a GPU (the ``tensorrt`` test at the end, skipped here with the reason)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from test_compare import make_net, sample, scaled_tanh_registry

import pipeline
from pipeline.comparison.layers import LayerMatch, OnnxRuntimeLayers, chunk_matches
from pipeline.comparison.tensorrt_layers import FUSED, NOTE, split_markable
from pipeline.runtime.tensorrt.identity import tensorrt_status


def match(module: str, tensor: str, nbytes: int = 100) -> LayerMatch:
    return LayerMatch(module, "Linear", tensor, f"node_{tensor}", "Gemm", 0, 0, 1, "float32", nbytes)


def test_tensors_the_network_lacks_are_unmatched_as_fused_and_left_out_of_the_chunks() -> None:
    matches = [match("a", "t0"), match("b", "t1"), match("b.c", "t1"), match("d", "t2"), match("e", "t3")]
    network = ["input_copy", "t0", "t1", "t3"]  # the parser fused away the node making t2
    kept, unmatched = split_markable(matches, network)
    assert [m.module for m in kept] == ["a", "b", "b.c", "e"]
    assert unmatched == [("d", "Linear", f"{FUSED} (tensor t2)")]
    # The chunking is ONNX Runtime's: t1 is shared by two modules and costs its size once for the backend.
    chunks = chunk_matches(kept, memory_budget=500)
    assert [[m.module for m in chunk] for chunk in chunks] == [["a", "b", "b.c"], ["e"]]
    assert {m.tensor for chunk in chunks for m in chunk} <= set(network)


class FilteredOnnxRuntime(OnnxRuntimeLayers):
    """ONNX Runtime intermediates, but only for the tensors a (pretend) parsed TensorRT network has: the flow of
    ``TensorRTLayers`` without its engines."""

    name = "tensorrt"

    def __init__(self, *args: Any, network: Sequence[str]) -> None:
        super().__init__(*args, note=NOTE)
        self.network = network

    def markable(self, matches: Sequence[LayerMatch]) -> tuple[list[LayerMatch], list[tuple[str, str, str]]]:
        return split_markable(matches, self.network)


def test_per_layer_with_fused_tensors_still_names_blocks_3_and_says_where_rows_come_from(tmp_path: Any) -> None:
    from pipeline.comparison.layers import compare_layers, match_modules, record_module_outputs
    from pipeline.comparison.runners import TorchReference

    model = make_net()
    module = pipeline.convert(
        model, sample(), converters=scaled_tanh_registry(0.01), backend="onnxruntime", validate=False
    )
    feed = {k: v.numpy() for k, v in sample().items()}
    matches, _ = match_modules(module.onnx, record_module_outputs(model, module.io, feed))
    by_module = {m.module: m.tensor for m in matches}
    fused = {by_module["blocks.3.act"], by_module["blocks.1"]}
    network = [t for t in by_module.values() if t not in fused]
    backend = FilteredOnnxRuntime(module.onnx, module.io, module.settings, network=network)
    report = compare_layers(
        model,
        TorchReference(model, module.io, "torch").model,
        module.io,
        module.onnx,
        [feed],
        module.settings,
        memory_budget=1500,
        backend=backend,
    )
    assert report.backend == "tensorrt" and "not the production engine" in report.note
    assert report.chunks > 1
    unmatched = {m: why for m, _, why in report.unmatched}
    assert unmatched["blocks.3.act"].startswith(FUSED) and unmatched["blocks.1"].startswith(FUSED)
    assert "blocks.3.act" not in [layer.module for layer in report.layers]
    assert report.first_divergence is not None and report.first_divergence.layer.module == "blocks.3"


def test_without_tensorrt_per_layer_uses_onnx_runtime_and_says_why() -> None:
    available, _ = tensorrt_status()
    if available:
        pytest.skip("TensorRT runs here: per-layer uses it")
    report = pipeline.compare(
        make_net(), sample(), converters=scaled_tanh_registry(0.01), per_layer=True, random_inputs=0
    )
    assert report.layers is not None and report.layers.backend == "onnxruntime"
    assert "TensorRT cannot run here" in report.layers.note
    assert "on onnxruntime" in report.table()
    only_ort = pipeline.compare(
        make_net(),
        sample(),
        converters=scaled_tanh_registry(0.01),
        per_layer=True,
        random_inputs=0,
        backends=["onnxruntime"],
    )
    assert only_ort.layers is not None and "TensorRT not among the backends" in only_ort.layers.note


AVAILABLE, WHY = tensorrt_status()


@pytest.mark.tensorrt
@pytest.mark.skipif(not AVAILABLE, reason=f"needs TensorRT and a CUDA GPU: {WHY}")
def test_per_layer_on_tensorrt_names_blocks_3_first(tmp_path: Any) -> None:
    report = pipeline.compare(
        make_net(),
        sample(),
        converters=scaled_tanh_registry(0.01),
        per_layer=True,
        random_inputs=1,
        memory_budget=4096,  # several chunks, so several engines
        cache_dir=str(tmp_path / "cache"),
        output_dir=tmp_path / "out",
    )
    layers = report.layers
    assert layers is not None and layers.backend == "tensorrt" and layers.chunks > 1
    assert "not the production engine" in layers.note
    divergence = report.first_divergence
    assert divergence is not None and divergence.layer.module == "blocks.3"
    before = layers.layers[: layers.layers.index(divergence.layer)]
    assert before and all(layer.passed for layer in before)
    assert "tensorrt on the final graph" in (tmp_path / "out" / "report.md").read_text()
