"""The precision pass's copy of TensorRT's type matrix matches the parser's operator matrix (package data)."""

from __future__ import annotations

import csv
from importlib import resources

from passes.precision.types import LOW_TYPES, TRT_FLOAT_OPS, TRT_NO_BF16, TRT_NO_FP16, trt_accepts


def matrix() -> dict[str, set[str]]:
    with resources.files("pipeline.compatibility.data").joinpath("trt_onnx_ops.csv").open(encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    return {r["op"]: set(r["types"].split(";")) for r in rows if r["supported"] == "Y"}


def test_float_ops_and_half_types_match_the_parser_matrix() -> None:
    table = matrix()
    floats = {op for op, types in table.items() if types & {"FP32", "FP16", "BF16"}}
    assert floats == TRT_FLOAT_OPS
    assert {op for op in floats if "FP16" not in table[op]} == TRT_NO_FP16
    assert {op for op in floats if "BF16" not in table[op]} == TRT_NO_BF16


def test_trt_accepts_names_the_missing_type_and_unknown_ops() -> None:
    assert trt_accepts("MatMul", LOW_TYPES["bf16"]) is None
    assert trt_accepts("GridSample", LOW_TYPES["bf16"]) == "TensorRT's ONNX parser does not take GridSample in BF16"
    assert trt_accepts("GridSample", LOW_TYPES["fp16"]) is None
    assert "no float Unique" in str(trt_accepts("Unique", LOW_TYPES["fp16"]))
