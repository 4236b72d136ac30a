"""TensorRT's ONNX parser support matrix (package data), resolved for one TensorRT version."""

from __future__ import annotations

import csv
import functools
import re
from dataclasses import dataclass
from importlib import resources

MATRIX_VERSION = (11, 1)
DEFAULT_TRT_VERSION = "11.1"
#: Deltas that widen what an already supported op accepts (not whether the op is supported at all).
REFINEMENTS = frozenset({"*opset*", "Squeeze", "GridSample", "Pow", "Einsum"})


@dataclass(frozen=True)
class OpSupport:
    """One row of the parser's operator matrix: supported or not, the types it takes, and its restrictions."""

    op: str
    supported: bool
    types: frozenset[str]
    restrictions: str
    source: str


def parse_version(text: str) -> tuple[int, ...]:
    """``"10.16.1.11"`` -> ``(10, 16, 1, 11)``; the first two fields are what the matrix distinguishes."""
    parts = re.findall(r"\d+", text)
    if not parts:
        raise ValueError(f"not a TensorRT version: {text!r}")
    return tuple(int(p) for p in parts)


@functools.cache
def _rows(name: str) -> tuple[dict[str, str], ...]:
    with resources.files("pipeline.compatibility.data").joinpath(name).open(encoding="utf-8") as handle:
        return tuple(csv.DictReader(handle))


@functools.cache
def support_table(trt_version: str = DEFAULT_TRT_VERSION) -> dict[str, OpSupport]:
    """op_type -> support for ``trt_version``: the 11.1 matrix with the recorded version deltas applied."""
    version = parse_version(trt_version)[:2]
    table = {
        r["op"]: OpSupport(
            r["op"],
            r["supported"] == "Y",
            frozenset(t for t in r["types"].split(";") if t),
            r["restrictions"],
            r["source_version"],
        )
        for r in _rows("trt_onnx_ops.csv")
    }
    for delta in _rows("trt_onnx_ops_version_deltas.csv"):
        if delta["op"] in REFINEMENTS:
            continue  # a refinement of an op supported either way; the checker's own rules handle it
        since = parse_version(delta["min_trt_version"].split("/")[0])[:2]
        for op in delta["op"].split(";"):
            known = table.get(op)
            added = version >= since
            if known is None or not known.supported or since > MATRIX_VERSION:
                types = known.types if known else frozenset({"FP32", "FP16", "BF16"})
                restrictions = known.restrictions if known else ""
                table[op] = OpSupport(op, added, types, restrictions, delta["source"])
            elif not added:  # supported in 11.1 but added after the requested version
                table[op] = OpSupport(op, False, known.types, known.restrictions, delta["source"])
    return table


@functools.cache
def custom_ops() -> frozenset[str]:
    """TensorRT-specific op types the parser accepts (TRT_Attention, ...)."""
    return frozenset(r["op"] for r in _rows("trt_custom_ops.csv"))


def min_version(op: str) -> str | None:
    """The TensorRT version from which ``op`` is supported, when a delta records one."""
    for delta in _rows("trt_onnx_ops_version_deltas.csv"):
        if op in delta["op"].split(";"):
            return delta["min_trt_version"]
    return None
