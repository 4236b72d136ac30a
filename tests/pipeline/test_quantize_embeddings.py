"""``quantize_embeddings=True``: embedding tables (Gather of a constant) in 4 bits, read through DequantizeLinear
before the Gather (passes/quantize/embeddings.py), a head tied to the table reading the same 4-bit table (stored
once): ONNX Runtime matches numpy's dequantized table, the real TensorRT-RTX builder builds the graph, and the
artifact of a tied language model is smaller than without the setting."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from charlm_support import CharLM
from onnx import TensorProto, helper, numpy_helper
from quantize_support import build_with_tensorrt_rtx
from rtx_build import rtx_build_error

import pipeline
from converters.errors import InputError
from converters.settings import Settings
from passes import to_graph, to_model
from passes.quantize.blockwise import BLOCK_FORMATS, fake_quantize
from passes.quantize.embeddings import find_tables, quantize_tables
from pipeline.runtime.ort.emulation import emulate_fp4

VOCAB, WIDTH = 48, 64
FOUR_BIT = (TensorProto.INT4, TensorProto.FLOAT4E2M1)


def tied_graph(float_type: int) -> tuple[onnx.ModelProto, np.ndarray]:
    """ids [B, S] -> Gather(table [V, D]) -> Relu -> MatMul(table transposed, its own constant, as the exporter
    writes a tied head) -> logits; and the float32 table."""
    table = (np.random.default_rng(0).standard_normal((VOCAB, WIDTH)) * 0.1).astype(np.float32)
    dtype = helper.tensor_dtype_to_np_dtype(float_type)
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["table", "ids"], ["embedded"], name="embed"),
            helper.make_node("Relu", ["embedded"], ["hidden"], name="relu"),
            helper.make_node("MatMul", ["hidden", "head_weight"], ["logits"], name="head"),
        ],
        "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["B", "S"])],
        [helper.make_tensor_value_info("logits", float_type, ["B", "S", VOCAB])],
        [
            numpy_helper.from_array(table.astype(dtype), "table"),
            numpy_helper.from_array(table.T.astype(dtype), "head_weight"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 11
    return model, table


@pytest.mark.parametrize(("precision", "block", "targets"), [("int4", 32, ("8.0",)), ("nvfp4", 16, ("12.0",))])
def test_a_tied_table_is_stored_once_in_4_bits_matches_numpy_and_builds(
    precision: str, block: int, targets: tuple[str, ...]
) -> None:
    model, table = tied_graph(TensorProto.FLOAT16)
    graph, metadata = to_graph(model)
    tables, skipped = find_tables(graph, block)
    assert not skipped and [(t.node, t.tied) for t in tables] == [("embed", ("head",))]
    done = quantize_tables(graph, BLOCK_FORMATS[precision], tables, {"embed": table}, block)
    assert [op.node for op in done] == ["embed", "head"]
    rewritten = to_model(graph, model, metadata)
    onnx.checker.check_model(rewritten, full_check=True)
    stored = [t for t in rewritten.graph.initializer if t.data_type in FOUR_BIT]
    assert len(stored) == 1 and list(stored[0].dims) == [VOCAB, WIDTH]  # once, for the Gather and the head
    assert not any(np.prod(t.dims) == VOCAB * WIDTH for t in rewritten.graph.initializer if t not in stored)
    ops = [n.op_type for n in rewritten.graph.node]
    assert ops.index("DequantizeLinear") < ops.index("Gather")  # dequantized before the Gather
    ids = np.random.default_rng(1).integers(0, VOCAB, (2, 7))
    runnable = emulate_fp4(rewritten) if precision == "nvfp4" else rewritten
    got = ort.InferenceSession(runnable.SerializeToString()).run(None, {"ids": ids})[0].astype(np.float32)
    dequantized = fake_quantize(BLOCK_FORMATS[precision], table, block, np.float16).astype(np.float16)
    want = np.maximum(dequantized[ids], 0).astype(np.float32) @ dequantized.T.astype(np.float32)
    np.testing.assert_allclose(got, want, atol=2e-3, rtol=2e-3)  # float16 MatMul
    assert build_with_tensorrt_rtx(rewritten, capabilities=targets) > 0


def tied_lm() -> torch.nn.Module:
    torch.manual_seed(0)
    model = CharLM(40, width=64, layers=1).eval()
    model.head.weight = model.embed.weight  # tied, as GPT-2 and Llama-3.2-1B are
    return model


def test_a_tied_language_model_converts_builds_and_shrinks(tmp_path: Path) -> None:
    sample = torch.randint(0, 40, (2, 16), generator=torch.Generator().manual_seed(0))
    module = pipeline.convert(tied_lm(), sample, precision="int4", block_size=32, quantize_embeddings=True)
    report = module.report.quantization
    assert report is not None and module.report.accuracy is not None and module.report.accuracy.passed
    assert [op.op for op in report.quantized].count("Gather") == 1
    assert any("tied heads reading the same 4-bit table" in note for note in report.notes)
    assert report.weight_share == 1.0  # the tied head reads the 4-bit table, whatever keep_head says
    assert rtx_build_error(module.onnx) is None
    baseline = pipeline.convert(tied_lm(), sample, precision="int4", block_size=32, validate=False)
    small = module.save(tmp_path / "tables.ptrt").stat().st_size
    plain = baseline.save(tmp_path / "plain.ptrt").stat().st_size
    assert plain - small > 0.5 * 40 * 64 * 4  # the float32 table and the float16 head, now one 4-bit table


def test_quantize_embeddings_needs_a_4bit_precision() -> None:
    assert not Settings(precision="int4").quantize_embeddings
    with pytest.raises(InputError, match="quantize_embeddings=True stores embedding tables in 4 bits"):
        Settings(precision="fp16", quantize_embeddings=True)
