"""Which form of a cached decoder step's attention reads only the filled part of the cache on TensorRT-RTX?

Issue 35, item 1 (the TensorRT half). Today's step graph (``pipeline/generation/ops.py``) writes each layer's new
keys and values into the static cache with ``TensorScatter`` and runs ONNX ``Attention`` over the whole capacity
with a boolean mask: every decode step costs what ``max_length`` costs. This probe builds one layer of that step in
several candidate forms where the attention reads only the first ``T = past_length + S`` positions, hands each to
the real TensorRT-RTX ONNX parser and strongly typed ahead-of-time builder with the converter's two optimization
profiles (context: S 1..CAP; generation: S = 1), and runs every standard-ONNX form on ONNX Runtime's CPU provider
against a float64 numpy reference (the whole-capacity semantics: causal + left padding + own position; the present
caches exactly ``TensorScatter``'s).

Forms (``--forms``; each with ONNX ``Attention`` or the decomposition ``ops.py`` emits for fp32 TensorRT):

- ``cap``: today's graph, attention over the whole capacity (the baseline).
- ``a_past``: ``Slice(present, 0, T, axis 2)`` and ``Slice(mask, 0, T, axis 3)``, ``T`` computed from the
  ``past_length`` input tensor (a value: TensorRT turns ``past_length`` into a shape tensor, in host memory).
- ``b1_total``: the same with ``T`` given as an extra int64 [1] input ``total_length`` (TensorRT: a shape tensor).
- ``b2_mask``: ``attention_mask`` is [B, T], sized to the filled length; ``T`` is its own dimension (a shape, not a
  value) and the slice bound is ``Shape(attention_mask)[1]``; the mask is built over ``T`` positions directly.
- ``b2_mask_3p``: ``b2_mask`` with a third optimization profile, generation with the mask width pinned to CAP (the
  runtime would pick it once the cache is mostly full).
- ``b3_mask_nopast``: ``b2_mask`` without the ``past_length`` input: the write index is ``T - S`` from shapes.
- ``c1_trt_mask`` / ``c2_trt_causal``: TensorRT's own ``TRT_KVCacheUpdate`` + ``TRT_Attention`` with
  ``kv_lengths`` = T per row (with the boolean mask over CAP, or ``causal_kind=lower_right`` without a mask);
  ONNX Runtime cannot run them.
- ``d_nonpad``: ONNX ``Attention`` (24) over the whole capacity with the mask and a ``nonpad_kv_seqlen`` input = T
  (does TensorRT use the lengths, or drop them?).
- ``e_attr``: ``b2_mask`` with TensorRT's ``TRT_decomposable=1`` attribute on the ONNX ``Attention`` node (lets fp32
  build; not valid ONNX: ONNX Runtime refuses the attribute).
- ``f_flat``: ``b2_mask`` with the cache as [B, 1, CAP, Hkv*D] (the filled prefix of a row contiguous: can the
  kernel read the slice in place?).

No engine runs here (CPU only), and ``IEngineInspector`` needs a deserialized engine (a GPU). What the builder
reveals instead: the parsed network's layer shapes (the K/V length of the attention layer: -1, dynamic, or CAP) and
the engine layer information it logs at verbose level with detailed profiling verbosity (every kernel of each
profile with its input dimensions: the fused attention kernel, the K length it reads, the copies around it).

    .venv/bin/python benchmarks/probe_filled_attention.py --out /tmp/filled_attention.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HQ, HKV = 4, 2
MAX_BATCH = 4
#: the compute capability every build targets (one keeps the AOT builds small on a shared 2-core machine)
DEFAULT_CCS = ("SM89",)
TRT_DOMAIN = "trt"
_NP = {"fp16": np.float16, "fp32": np.float32}
_ONNX = {"fp16": TensorProto.FLOAT16, "fp32": TensorProto.FLOAT}
#: builder log lines worth keeping from the verbose stream
_NOTABLE = re.compile(
    r"attention|mha|fmha|kv.?cache|data.?dependent|shape tensor|unused|decompos|fus|myelin|slice|size tensor",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Case:
    """One graph size and precision."""

    cap: int
    head_dim: int
    dtype: str  # "fp16" | "fp32"

    @property
    def label(self) -> str:
        """``fp16 CAP256 D64``."""
        return f"{self.dtype} CAP{self.cap} D{self.head_dim}"


@dataclass(frozen=True)
class Form:
    """A candidate graph form.

    ``length``: where ``T`` comes from ("cap": no slice; "past": the ``past_length`` value; "total": an int64 [1]
    input; "mask": the attention mask's own dimension; "mask_nopast": the same, and no ``past_length`` input).
    ``attention``: "onnx" (ONNX ``Attention`` with the boolean mask), "decomposed" (MatMul/Softmax as ``ops.py``),
    "nonpad" (ONNX ``Attention`` with ``nonpad_kv_seqlen``), "trt_mask" / "trt_causal" (``TRT_Attention``).
    ``write``: "scatter" (ONNX ``TensorScatter``) or "trt" (``TRT_KVCacheUpdate``)."""

    name: str
    length: str
    attention: str
    write: str = "scatter"
    note: str = ""
    #: "bhsd": the cache [B, Hkv, CAP, D] (today); "flat": [B, 1, CAP, Hkv*D]
    layout: str = "bhsd"
    #: TensorRT's ``TRT_decomposable=1`` on the ONNX ``Attention`` node (not in the ONNX schema)
    trt_attr: bool = False
    #: a third profile: generation with the mask width pinned to CAP (does the slice vanish there?)
    full_profile: bool = False

    @property
    def profiles(self) -> int:
        """How many optimization profiles the engine gets: context, generation (and generation at T = CAP)."""
        return 3 if self.full_profile else 2

    @property
    def standard(self) -> bool:
        """Standard ONNX: what the converter may emit as ``module.onnx`` (ONNX Runtime is the reference)."""
        return self.write == "scatter" and not self.attention.startswith("trt") and not self.trt_attr

    @property
    def ort_runnable(self) -> bool:
        """No TensorRT-domain op: worth handing to ONNX Runtime (it may still refuse a TensorRT attribute)."""
        return self.write == "scatter" and not self.attention.startswith("trt")


FORMS: tuple[Form, ...] = (
    Form("cap", "cap", "onnx", note="today: Attention over CAP"),
    Form("cap_dec", "cap", "decomposed", note="today's fp32 TensorRT form"),
    Form("a_past", "past", "onnx", note="T from the past_length value"),
    Form("a_past_dec", "past", "decomposed"),
    Form("b1_total", "total", "onnx", note="T from an int64 [1] input"),
    Form("b1_total_dec", "total", "decomposed"),
    Form("b2_mask", "mask", "onnx", note="attention_mask [B,T]: T is a dimension"),
    Form("b2_mask_dec", "mask", "decomposed"),
    Form("b2_mask_3p", "mask", "onnx", full_profile=True, note="b2 + a generation profile with T = CAP"),
    Form("b2_mask_dec_3p", "mask", "decomposed", full_profile=True),
    Form("b3_mask_nopast", "mask_nopast", "onnx", note="b2 with write index T-S from shapes"),
    Form("b3_mask_nopast_dec", "mask_nopast", "decomposed"),
    Form("c1_trt_mask", "cap", "trt_mask", write="trt", note="TRT ops, mask over CAP + kv_lengths"),
    Form("c2_trt_causal", "cap", "trt_causal", write="trt", note="TRT ops, lower_right + kv_lengths, no mask"),
    Form("d_nonpad", "cap", "nonpad", note="Attention-24 mask + nonpad_kv_seqlen input = T"),
    Form("e_attr", "mask", "onnx", trt_attr=True, note="b2 + TRT_decomposable=1 on ONNX Attention"),
    Form("f_flat", "mask", "onnx", layout="flat", note="b2 with the cache [B,1,CAP,Hkv*D]"),
)


class GraphBuilder:
    """A few helpers over ``onnx.helper`` that name every node's outputs."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self._count = 0

    def _name(self, op: str) -> str:
        self._count += 1
        return f"{op.lower()}_{self._count}"

    def input(self, name: str, elem: int, shape: Sequence[int | str]) -> str:
        """Declare a graph input."""
        self.inputs.append(helper.make_tensor_value_info(name, elem, list(shape)))
        return name

    def output(self, name: str, elem: int, shape: Sequence[int | str]) -> None:
        """Declare a graph output (a tensor some node already produces)."""
        self.outputs.append(helper.make_tensor_value_info(name, elem, list(shape)))

    def const(self, value: np.ndarray) -> str:
        """An initializer."""
        name = self._name("const")
        self.inits.append(numpy_helper.from_array(value, name))
        return name

    def ints(self, *values: int) -> str:
        """An int64 vector constant."""
        return self.const(np.array(values, np.int64))

    def op(self, op: str, *inputs: str, out: str | None = None, domain: str = "", **attrs: Any) -> str:
        """Add a node with one output (named ``out`` or generated); return that name."""
        name = out or self._name(op)
        self.nodes.append(helper.make_node(op, list(inputs), [name], name=f"n_{name}", domain=domain, **attrs))
        return name

    def model(self, opset: int = 24, trt_domain: bool = False) -> onnx.ModelProto:
        """The model (IR 10, opset ``opset``; the ``trt`` domain declared when used)."""
        graph = helper.make_graph(self.nodes, "filled_attention", self.inputs, self.outputs, initializer=self.inits)
        opsets = [helper.make_opsetid("", opset)]
        if trt_domain:
            opsets.append(helper.make_opsetid(TRT_DOMAIN, 1))
        model = helper.make_model(graph, opset_imports=opsets, producer_name="probe_filled_attention")
        model.ir_version = 10
        return model


def build_graph(form: Form, case: Case) -> onnx.ModelProto:
    """One layer of the cached step in ``form``: inputs ``query`` [B,Hq,S,D], ``key``/``value`` [B,Hkv,S,D] (the
    step's new keys and values), ``past_key_values.0.key/value`` [B,Hkv,CAP,D], ``attention_mask`` [B,CAP] int64
    ([B,T] in the mask forms), ``past_length`` [] int64 (not in ``mask_nopast``), ``total_length`` [1] int64 (in
    ``total``); outputs ``attn`` [B,Hq,S,D] and ``present.0.key/value`` [B,Hkv,CAP,D]."""
    g = GraphBuilder()
    elem, np_dtype = _ONNX[case.dtype], _NP[case.dtype]
    d, cap = case.head_dim, case.cap
    q = g.input("query", elem, ["B", HQ, "S", d])
    k_new = g.input("key", elem, ["B", HKV, "S", d])
    v_new = g.input("value", elem, ["B", HKV, "S", d])
    cache_shape: list[int | str] = ["B", HKV, cap, d] if form.layout == "bhsd" else ["B", 1, cap, HKV * d]
    past_k = g.input("past_key_values.0.key", elem, cache_shape)
    past_v = g.input("past_key_values.0.value", elem, cache_shape)
    mask_len: int | str = "T" if form.length.startswith("mask") else cap
    attention_mask = g.input("attention_mask", TensorProto.INT64, ["B", mask_len])
    past_length = "" if form.length == "mask_nopast" else g.input("past_length", TensorProto.INT64, [])
    total_length = g.input("total_length", TensorProto.INT64, [1]) if form.length == "total" else ""
    nonpad_input = g.input("nonpad_kv_seqlen", TensorProto.INT64, ["B"]) if form.attention == "nonpad" else ""

    steps = g.op("Slice", g.op("Shape", q), g.ints(2), g.ints(3))  # [1] S
    batch = g.op("Slice", g.op("Shape", q), g.ints(0), g.ints(1))  # [1] B
    mask_width = g.op("Slice", g.op("Shape", attention_mask), g.ints(1), g.ints(2))  # [1] CAP or T
    # the write position: past_length, or from shapes (T - S) when there is no past_length input
    past_1d = g.op("Reshape", past_length, g.ints(1)) if past_length else g.op("Sub", mask_width, steps)
    # T, the filled length after this step, where the form takes it from
    total = {
        "cap": "",
        "past": g.op("Add", past_1d, steps) if past_length else "",
        "total": total_length,
        "mask": mask_width,
        "mask_nopast": mask_width,
    }[form.length]

    # the cache write: TensorScatter (ONNX) or TRT_KVCacheUpdate, one write index per row (all equal)
    write_indices = g.op("Expand", past_1d, batch)
    if form.write == "trt":
        index32 = g.op("Cast", write_indices, to=TensorProto.INT32)
        present_k = g.op("TRT_KVCacheUpdate", past_k, k_new, index32, out="present.0.key", domain=TRT_DOMAIN)
        present_v = g.op("TRT_KVCacheUpdate", past_v, v_new, index32, out="present.0.value", domain=TRT_DOMAIN)
    elif form.layout == "flat":  # the step's [B,Hkv,S,D] as [B,1,S,Hkv*D]
        flat = [
            g.op("Reshape", g.op("Transpose", x, perm=[0, 2, 1, 3]), g.ints(0, 1, -1, HKV * d)) for x in (k_new, v_new)
        ]
        present_k = g.op("TensorScatter", past_k, flat[0], write_indices, out="present.0.key", axis=-2)
        present_v = g.op("TensorScatter", past_v, flat[1], write_indices, out="present.0.value", axis=-2)
    else:
        present_k = g.op("TensorScatter", past_k, k_new, write_indices, out="present.0.key", axis=-2)
        present_v = g.op("TensorScatter", past_v, v_new, write_indices, out="present.0.value", axis=-2)

    # the boolean mask [B,1,S,M] over the attention mask's M positions, as transformers builds it: causal from
    # past_length, the padding of attention_mask, and every query sees its own position (step_attention)
    m_scalar = g.op("Squeeze", mask_width, g.ints(0))
    s_scalar = g.op("Squeeze", steps, g.ints(0))
    key_pos = g.op("Range", g.const(np.array(0, np.int64)), m_scalar, g.const(np.array(1, np.int64)))
    query_pos = g.op(
        "Add", g.op("Range", g.const(np.array(0, np.int64)), s_scalar, g.const(np.array(1, np.int64))), past_1d
    )
    key_row = g.op("Unsqueeze", key_pos, g.ints(0))  # [1, M]
    query_col = g.op("Unsqueeze", query_pos, g.ints(1))  # [S, 1]
    causal = g.op("LessOrEqual", key_row, query_col)  # [S, M]
    own = g.op("Equal", key_row, query_col)
    padding = g.op("Unsqueeze", g.op("Cast", attention_mask, to=TensorProto.BOOL), g.ints(1, 2))  # [B,1,1,M]
    mask = g.op(
        "Or", g.op("And", g.op("Unsqueeze", causal, g.ints(0, 1)), padding), g.op("Unsqueeze", own, g.ints(0, 1))
    )

    keys, values = present_k, present_v
    if total and form.length in ("past", "total"):  # slice the cache and the CAP-wide mask to T
        keys = g.op("Slice", present_k, g.ints(0), total, g.ints(2))
        values = g.op("Slice", present_v, g.ints(0), total, g.ints(2))
        mask = g.op("Slice", mask, g.ints(0), total, g.ints(3))
    elif total:  # the mask is already T wide: only the cache is sliced
        keys = g.op("Slice", present_k, g.ints(0), total, g.ints(2))
        values = g.op("Slice", present_v, g.ints(0), total, g.ints(2))

    if form.layout == "flat":  # back to [B,Hkv,T,D] for the attention
        keys, values = (
            g.op("Transpose", g.op("Reshape", x, g.ints(0, -1, HKV, d)), perm=[0, 2, 1, 3]) for x in (keys, values)
        )

    scale = 1.0 / math.sqrt(d)
    if form.attention == "onnx":
        extra = {"TRT_decomposable": 1} if form.trt_attr else {}
        out = g.op("Attention", q, keys, values, mask, out="attn", scale=scale, **extra)
    elif form.attention == "nonpad":
        out = g.op("Attention", q, keys, values, mask, "", "", nonpad_input, out="attn", scale=scale)
    elif form.attention == "decomposed":
        out = _decomposed(g, q, keys, values, mask, scale, np_dtype)
    else:  # TRT_Attention: the caller scales Q; kv_lengths int32 [B]
        filled = g.op("Add", past_1d, steps)
        kv_lengths = g.op("Cast", g.op("Expand", filled, batch), to=TensorProto.INT32)
        q_scaled = g.op("Mul", q, g.const(np.array(scale, np_dtype)))
        attrs: dict[str, Any] = {}
        if case.dtype == "fp32":
            attrs["TRT_decomposable"] = 1
        if form.attention == "trt_mask":  # inputs: Q, K, V, attn_mask, query_lengths, kv_lengths
            trt_inputs = [q_scaled, keys, values, mask, "", kv_lengths]
        else:
            trt_inputs = [q_scaled, keys, values, "", "", kv_lengths]
            attrs["causal_kind"] = "lower_right"
        out = g.op("TRT_Attention", *trt_inputs, out="attn", domain=TRT_DOMAIN, **attrs)
    g.output(out, elem, ["B", HQ, "S", d])
    g.output(present_k, elem, cache_shape)
    g.output(present_v, elem, cache_shape)
    return g.model(trt_domain=form.write == "trt" or form.attention.startswith("trt"))


def _decomposed(g: GraphBuilder, q: str, k: str, v: str, mask: str, scale: float, np_dtype: type) -> str:
    """``softmax(where(mask, q k^T * scale, lowest)) v`` with the query heads folded as [B, Hkv, G, S, D] (the
    decomposition ``ops.py`` emits for fp32 TensorRT)."""
    q_shape = g.op("Shape", q)
    grouped = g.op(
        "Concat",
        g.op("Slice", q_shape, g.ints(0), g.ints(1)),
        g.ints(HKV, -1),
        g.op("Slice", q_shape, g.ints(2), g.ints(4)),
        axis=0,
    )
    q5 = g.op("Reshape", q, grouped)
    k5 = g.op("Unsqueeze", k, g.ints(2))
    v5 = g.op("Unsqueeze", v, g.ints(2))
    scores = g.op(
        "Mul", g.op("MatMul", q5, g.op("Transpose", k5, perm=[0, 1, 2, 4, 3])), g.const(np.array(scale, np_dtype))
    )
    lowest = g.const(np.array(np.finfo(np_dtype).min, np_dtype))
    scores = g.op("Where", g.op("Unsqueeze", mask, g.ints(2)), scores, lowest)
    out = g.op("MatMul", g.op("Softmax", scores, axis=-1), v5)
    return g.op("Reshape", out, q_shape, out="attn")


# ---------------------------------------------------------------------------------------------------- reference


@dataclass(frozen=True)
class Scenario:
    """One step: batch rows, ``steps`` new tokens at ``past`` (row 1 left-padded by ``pad`` positions)."""

    name: str
    past: int
    steps: int
    batch: int = 2
    pad: int = 3
    #: the mask forms (``b2``) given an attention mask wider than T by this many positions (zeros: a runtime that
    #: rounds the width up to a bucket); 0: exactly T
    wider: int = 0


def scenarios(cap: int) -> list[Scenario]:
    """Prefill, a chunk over a past, decode steps early, mid and at the last position (T = CAP)."""
    return [
        Scenario("prefill", 0, 7),
        Scenario("chunk", 7, 4),
        Scenario("decode", 11, 1),
        Scenario("decode_mid", cap // 2, 1),
        Scenario("decode_last", cap - 1, 1),
        Scenario("decode_wider_mask", 11, 1, wider=29),
    ]


def step_inputs(case: Case, sc: Scenario, seed: int = 0) -> dict[str, np.ndarray]:
    """Random queries, keys, values and a cache full of stale values everywhere (positions >= T included: they
    must not matter); attention_mask [B, CAP] with row 1's first ``pad`` positions padding and 0 beyond T."""
    rng = np.random.default_rng(seed)
    dt, d, b, s = _NP[case.dtype], case.head_dim, sc.batch, sc.steps
    total = sc.past + s
    mask = np.zeros((b, case.cap), np.int64)
    mask[:, :total] = 1
    if b > 1:
        mask[1, : sc.pad] = 0
    return {
        "query": rng.standard_normal((b, HQ, s, d)).astype(dt),
        "key": rng.standard_normal((b, HKV, s, d)).astype(dt),
        "value": rng.standard_normal((b, HKV, s, d)).astype(dt),
        "past_key_values.0.key": rng.standard_normal((b, HKV, case.cap, d)).astype(dt),
        "past_key_values.0.value": rng.standard_normal((b, HKV, case.cap, d)).astype(dt),
        "attention_mask": mask,
        "past_length": np.array(sc.past, np.int64),
    }


def reference(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The whole-capacity step in float64: TensorScatter at past_length, the boolean mask (causal, padding, own
    position) over CAP, grouped attention."""
    q, k, v = feeds["query"], feeds["key"], feeds["value"]
    past = int(feeds["past_length"])
    s = q.shape[2]
    present_k = feeds["past_key_values.0.key"].copy()
    present_v = feeds["past_key_values.0.value"].copy()
    present_k[:, :, past : past + s] = k
    present_v[:, :, past : past + s] = v
    cap = present_k.shape[2]
    key_pos = np.arange(cap)[None, :]
    query_pos = (np.arange(s) + past)[:, None]
    mask = ((key_pos <= query_pos)[None] & feeds["attention_mask"].astype(bool)[:, None, :]) | (key_pos == query_pos)
    groups = HQ // HKV
    kk = np.repeat(present_k.astype(np.float64), groups, axis=1)
    vv = np.repeat(present_v.astype(np.float64), groups, axis=1)
    scores = q.astype(np.float64) @ kk.transpose(0, 1, 3, 2) / math.sqrt(q.shape[-1])
    scores = np.where(mask[:, None], scores, -np.inf)
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    probs = scores / scores.sum(-1, keepdims=True)
    return {"attn": probs @ vv, "present.0.key": present_k, "present.0.value": present_v}


def form_feeds(form: Form, feeds: dict[str, np.ndarray], wider: int = 0) -> dict[str, np.ndarray]:
    """The whole-capacity feeds as ``form`` takes them (the mask cut to T, or to T + ``wider`` where the form
    allows it (``mask``: the write position is ``past_length``, not the width); total_length; no past_length)."""
    out = dict(feeds)
    total = int(feeds["past_length"]) + feeds["query"].shape[2]
    if form.length.startswith("mask"):
        width = total + wider if form.length == "mask" else total
        out["attention_mask"] = feeds["attention_mask"][:, :width].copy()
    if form.length == "mask_nopast":
        del out["past_length"]
    if form.length == "total":
        out["total_length"] = np.array([total], np.int64)
    if form.attention == "nonpad":
        out["nonpad_kv_seqlen"] = np.full(feeds["query"].shape[0], total, np.int64)
    if form.layout == "flat":
        for name in ("past_key_values.0.key", "past_key_values.0.value"):
            out[name] = to_flat(feeds[name])
    return out


def to_flat(cache: np.ndarray) -> np.ndarray:
    """[B, Hkv, CAP, D] -> [B, 1, CAP, Hkv*D]."""
    b, h, n, d = cache.shape
    return np.ascontiguousarray(cache.transpose(0, 2, 1, 3).reshape(b, 1, n, h * d))


def run_ort(form: Form, case: Case, model: onnx.ModelProto, timing: bool) -> dict[str, Any]:
    """Every scenario on ONNX Runtime's CPU provider: max |error| of ``attn`` against the float64 reference, whether
    the present caches equal TensorScatter's exactly, and max |difference| against the whole-capacity form with the
    same attention (``cap`` or ``cap_dec``); with ``timing``, the median time of one batch-1 decode step with 200
    positions filled (one thread; this one-layer graph only: what the slice saves on the CPU, not an engine time)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as error:  # noqa: BLE001 - the probe reports what ONNX Runtime says
        return {"ok": False, "error": str(error).splitlines()[0][:300]}
    same_attention = FORMS[1] if form.attention == "decomposed" else FORMS[0]
    baseline = ort.InferenceSession(
        build_graph(same_attention, case).SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    tolerance = 5e-3 if case.dtype == "fp16" else 1e-5
    rows: dict[str, Any] = {}
    ok = True
    for sc in scenarios(case.cap):
        feeds = step_inputs(case, sc)
        want = reference(feeds)
        try:
            got = _run(session, form_feeds(form, feeds, sc.wider))
        except Exception as error:  # noqa: BLE001
            rows[sc.name] = {"error": str(error).splitlines()[0][:300]}
            ok = False
            continue
        base = _run(baseline, feeds)
        err = float(np.max(np.abs(got["attn"].astype(np.float64) - want["attn"])))
        vs_cap = float(np.max(np.abs(got["attn"].astype(np.float64) - base["attn"].astype(np.float64))))
        flat = form.layout == "flat"
        cache_exact = all(
            np.array_equal(got[n], to_flat(want[n]) if flat else want[n]) for n in ("present.0.key", "present.0.value")
        )
        finite = bool(np.isfinite(got["attn"]).all())
        rows[sc.name] = {"max_err_vs_numpy": err, "max_diff_vs_cap_form": vs_cap, "cache_exact": cache_exact}
        ok = ok and finite and cache_exact and err <= tolerance
    result: dict[str, Any] = {"ok": ok, "tolerance": tolerance, "scenarios": rows}
    if timing:
        filled = min(200, case.cap)
        step = Scenario("timing", filled - 1, 1, batch=1)
        feeds = step_inputs(case, step)
        result["decode_ms_at_T"] = filled
        result["decode_ms"] = _median_ms(session, form_feeds(form, feeds))
        result["decode_ms_whole_capacity"] = _median_ms(baseline, feeds)
    return result


def _run(session: Any, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The session's outputs by name."""
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True))


def _median_ms(session: Any, feeds: dict[str, np.ndarray], runs: int = 60) -> float:
    """Median wall time of ``session.run`` in ms (after 5 warm-up runs)."""
    for _ in range(5):
        session.run(None, feeds)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - start)
    return round(1000 * float(np.median(times)), 4)


# ----------------------------------------------------------------------------------------------------- TensorRT


def _logger_class() -> type:
    import tensorrt_rtx as trt

    class CollectLogger(trt.ILogger):  # type: ignore[misc, name-defined]
        """Keeps every message (severity name, text)."""

        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.messages: list[tuple[str, str]] = []

        def log(self, severity: Any, msg: str) -> None:
            self.messages.append((str(severity).split(".")[-1], msg))

    return CollectLogger


def _profile_shapes(form: Form, case: Case, profile: int) -> dict[str, tuple[tuple[int, ...], ...]]:
    """(min, opt, max) per dynamic input: batch 1..MAX_BATCH; profile 0 (context): S 1..CAP, T 1..CAP; profile 1
    (generation): S 1, T 1..CAP; profile 2 (generation, full): S 1, T = CAP."""
    cap, d = case.cap, case.head_dim
    s = (1, min(64, cap), cap) if profile == 0 else (1, 1, 1)
    t = {0: (1, min(64, cap), cap), 1: (1, cap // 2, cap), 2: (cap, cap, cap)}[profile]
    b = (1, 1, MAX_BATCH)
    shapes: dict[str, tuple[tuple[int, ...], ...]] = {}
    for name, heads in (("query", HQ), ("key", HKV), ("value", HKV)):
        shapes[name] = tuple((b[i], heads, s[i], d) for i in range(3))
    for name in ("past_key_values.0.key", "past_key_values.0.value"):
        cache = (HKV, cap, d) if form.layout == "bhsd" else (1, cap, HKV * d)
        shapes[name] = tuple((b[i], *cache) for i in range(3))
    shapes["nonpad_kv_seqlen"] = tuple((b[i],) for i in range(3))
    width = t if form.length.startswith("mask") else (cap, cap, cap)
    shapes["attention_mask"] = tuple((b[i], width[i]) for i in range(3))
    return shapes


def _shape_input_values(name: str, case: Case, profile: int) -> tuple[list[int], list[int], list[int]]:
    """(min, opt, max) values of an input TensorRT made a shape tensor."""
    cap = case.cap
    if name == "past_length":
        return [0], [cap // 2 if profile else 0], [cap - 1]
    return [1], [cap // 2 if profile else min(64, cap)], [cap]


def _layer_shapes(network: Any) -> list[dict[str, Any]]:
    """The parsed network's attention, KV-cache-update and slice layers with their input/output shapes (-1:
    dynamic), in order."""
    import tensorrt_rtx as trt

    kinds = {
        trt.LayerType.ATTENTION_INPUT,
        trt.LayerType.ATTENTION_OUTPUT,
        trt.LayerType.KV_CACHE_UPDATE,
        trt.LayerType.SLICE,
        trt.LayerType.MATRIX_MULTIPLY,
        trt.LayerType.SOFTMAX,
    }
    out = []
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        if layer.type not in kinds:
            continue
        ins = [layer.get_input(j) for j in range(layer.num_inputs)]
        outs = [layer.get_output(j) for j in range(layer.num_outputs)]
        out.append(
            {
                "type": str(layer.type).split(".")[-1],
                "name": layer.name,
                "inputs": [list(t.shape) if t is not None else None for t in ins],
                "outputs": [list(t.shape) for t in outs if t is not None],
            }
        )
    return out


def _attention_kv_length(layers: list[dict[str, Any]]) -> str:
    """The K length the attention (or the first score MatMul) sees: "dynamic" (-1) or the static CAP."""
    for layer in layers:
        if layer["type"] == "ATTENTION_INPUT" and len(layer["inputs"]) > 1 and layer["inputs"][1]:
            length = layer["inputs"][1][2]
            return "dynamic" if length == -1 else str(length)
    for layer in layers:
        if layer["type"] == "MATRIX_MULTIPLY" and layer["outputs"]:
            length = layer["outputs"][0][-1]
            return "dynamic" if length == -1 else str(length)
    return "?"


def build_trt(form: Form, case: Case, path: Path, ccs: Sequence[str]) -> dict[str, Any]:
    """Parse ``path`` on a strongly typed network and build it with both profiles for each compute capability."""
    import tensorrt_rtx as trt

    logger = _logger_class()()
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    parsed = parser.parse_from_file(str(path))
    result: dict[str, Any] = {
        "parse": bool(parsed),
        "parse_errors": [str(parser.get_error(i)).replace("\n", " | ")[:400] for i in range(parser.num_errors)],
        "parse_warnings": _dedup(m for s, m in logger.messages if s == "WARNING"),
    }
    if not parsed:
        return result
    inputs = [network.get_input(i) for i in range(network.num_inputs)]
    result["inputs"] = {t.name: {"shape": list(t.shape), "shape_tensor": bool(t.is_shape_tensor)} for t in inputs}
    result["network_layers"] = _layer_shapes(network)
    result["attention_kv_length"] = _attention_kv_length(result["network_layers"])
    result["layer_types"] = sorted({str(network.get_layer(i).type).split(".")[-1] for i in range(network.num_layers)})
    names = {t.name for t in inputs}
    shape_inputs = [t.name for t in inputs if t.is_shape_tensor]
    if shape_inputs:  # what the converter's profiles (shapes only, no shape-input values) would get
        result["build_without_shape_values"] = _build_without_shape_values(builder, network, logger, form, case)
    builds = {}
    for cc in ccs:
        logger.messages.clear()
        config = builder.create_builder_config()
        config.num_compute_capabilities = 1
        config.set_compute_capability(getattr(trt.ComputeCapability, cc), 0)
        config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
        for index in range(form.profiles):
            profile = builder.create_optimization_profile()
            for name, (lo, opt, hi) in _profile_shapes(form, case, index).items():
                if name in names and name not in shape_inputs:
                    profile.set_shape(name, lo, opt, hi)
            for name in shape_inputs:
                profile.set_shape_input(name, *_shape_input_values(name, case, index))
            config.add_optimization_profile(profile)
        start = time.perf_counter()
        try:
            plan = builder.build_serialized_network(network, config)
            size = plan.nbytes if plan is not None else 0
        except Exception as error:  # noqa: BLE001 - the builder's refusal is the finding
            plan, size = None, 0
            logger.messages.append(("EXC", repr(error)))
        seconds = time.perf_counter() - start
        builds[cc] = {
            "build": plan is not None,
            "seconds": round(seconds, 2),
            "bytes": size,
            "errors": _dedup(m for s, m in logger.messages if s in ("ERROR", "INTERNAL_ERROR", "EXC")),
            "warnings": _dedup(m for s, m in logger.messages if s == "WARNING"),
            "notable": _dedup(
                m for s, m in logger.messages if s in ("VERBOSE", "INFO") and _NOTABLE.search(m) and "Name:" not in m
            )[:40],
            "engine_layers": engine_layers(logger.messages),
            "engine_io": engine_io(logger.messages),
        }
        builds[cc]["kernels"] = kernel_summary(builds[cc]["engine_layers"])
        del plan
    result["builds"] = builds
    return result


_LAYER = re.compile(r"^Name: (?P<name>[^,]+), LayerType: (?P<type>[^,]+),")
_TENSOR = re.compile(r"\{ Name: (?P<name>[^,]+), (?:Location: \w+, )?Dimensions: \[(?P<dims>[^\]]*)\]")
_TACTIC = re.compile(r"TacticName: (?P<tactic>[^,]*),")
_PROFILE = re.compile(r"\[profile (\d+)\]")


def engine_layers(messages: Sequence[tuple[str, str]]) -> list[dict[str, Any]]:
    """The builder's engine layer information (printed at verbose level with detailed profiling verbosity: the
    AOT build cannot be deserialized here, so no IEngineInspector): every kernel with its type, tactic, input and
    output dimensions, and the profile it belongs to (N when its tensors are tagged "[profile N]", else 0)."""
    dump = next((m for _, m in messages if m.startswith("Layers:")), "")
    layers = []
    for line in dump.splitlines():
        match = _LAYER.match(line.strip())
        if not match:
            continue
        inputs_part, _, outputs_part = line.partition("Outputs:")
        tensors_in = [(t["name"], t["dims"]) for t in _TENSOR.finditer(inputs_part)]
        tensors_out = [(t["name"], t["dims"]) for t in _TENSOR.finditer(outputs_part)]
        tactic = _TACTIC.search(line)
        layers.append(
            {
                "name": match["name"],
                "type": match["type"],
                "tactic": tactic["tactic"] if tactic else "",
                "profile": int(tagged[1]) if (tagged := _PROFILE.search(line)) else 0,
                "inputs": tensors_in,
                "outputs": tensors_out,
            }
        )
    return layers


_SUFFIX = re.compile(r"^(?:__myl_|_)|_myl\d+_\d+$")


_IO = re.compile(
    r"^Name: (?P<name>.+?), IOMode: (?P<mode>\w+), .*?Location: (?P<loc>\w+), IsShapeInferenceIO: (?P<shape>\w+)"
)


def engine_io(messages: Sequence[tuple[str, str]]) -> dict[str, dict[str, str]]:
    """The engine's I/O tensors as the builder reports them: where each lives (Host: a shape-inference input the
    runtime must pass in host memory) and whether it is a shape-inference input."""
    dump = next((m for _, m in messages if m.startswith("Layers:")), "")
    _, _, io_part = dump.partition("I/O Tensors:")
    out = {}
    for line in io_part.splitlines():
        match = _IO.match(line.strip())
        if match:
            out[match["name"]] = {"mode": match["mode"], "location": match["loc"], "shape_io": match["shape"]}
    return out


def kernel_summary(layers: list[dict[str, Any]]) -> dict[str, Any]:
    """Per profile: every kernel (its short name and the dims of its inputs), the fused attention kernels ("mha"
    in the name) with the dims of the K and V they read ([B, Hkv, L, D]: L -1 is dynamic, else CAP), and the
    kernels that slice the cache (Myelin's "Slic": a copy of the filled part)."""
    out: dict[str, Any] = {}
    for profile in sorted({layer["profile"] for layer in layers} | {0, 1}):
        mine = [layer for layer in layers if layer["profile"] == profile and layer["type"] != "shape_call"]
        kernels = [
            {"kernel": _SUFFIX.sub("", layer["name"]), "type": layer["type"], "inputs": [d for _, d in layer["inputs"]]}
            for layer in mine
        ]
        attention = [
            {"kernel": k["kernel"], "kv_dims": [d for d in k["inputs"] if d.count(",") == 3][:2]}
            for k in kernels
            if "mha" in k["kernel"].lower()
        ]
        slices = [k["kernel"] for k in kernels if k["kernel"].startswith("Slic")]
        out[f"profile{profile}"] = {"kernels": kernels, "attention": attention, "cache_slices": slices}
    return out


_DATA_MOVEMENT = re.compile(r"^(?:Slic|Move|Resh|Tran|Repl|Conc|Mul)+$")


def generation_chain(row_trt: dict[str, Any], profile: int = 1) -> str:
    """A generation profile's kernels in one line (from the first successful build): how many, which only move
    data (copies of the cache: Myelin's "Slic" = the slice materialised; "Tran"/"Move"/"Repl"/"Conc" =
    transposes and padding), and what the attention reads: the fused kernel's K length, or the GEMMs' (T when
    dynamic, else CAP)."""
    builds = [b for b in row_trt.get("builds", {}).values() if b.get("build")]
    if not builds or f"profile{profile}" not in builds[0]["kernels"]:
        return "-"
    kernels = builds[0]["kernels"][f"profile{profile}"]["kernels"]
    copies = [k["kernel"] for k in kernels if _DATA_MOVEMENT.match(k["kernel"])]
    reads = []
    for k in kernels:
        if "mha" in k["kernel"].lower():
            kv = [d for d in k["inputs"] if d.count(",") == 3][:1]
            length = kv[0].split(",")[2] if kv else "?"
            extra = " + bool mask" if len(kv) and sum(d.count(",") == 3 for d in k["inputs"]) >= 4 else ""
            extra += " + per-row KV lengths" if "-1" in k["inputs"] else ""
            reads.append(f"{k['kernel']} over {'T' if length == '-1' else length}{extra}")
        elif k["type"] == "gemm" and len(k["inputs"]) > 1:
            length = k["inputs"][1].split(",")[-1] if not reads else k["inputs"][1].split(",")[-2]
            reads.append(f"GEMM over {'T' if length == '-1' else length}")
    copied = f"{len(copies)} data-movement ({', '.join(copies)})" if copies else "no copy"
    return f"{len(kernels)} kernels: {copied}; {'; '.join(reads) or '?'}"


def _build_without_shape_values(builder: Any, network: Any, logger: Any, form: Form, case: Case) -> str:
    """Build with both profiles' shapes but no ``set_shape_input`` values: the builder's first error."""
    logger.messages.clear()
    config = builder.create_builder_config()
    names = {network.get_input(i).name for i in range(network.num_inputs)}
    for index in range(form.profiles):
        profile = builder.create_optimization_profile()
        for name, (lo, opt, hi) in _profile_shapes(form, case, index).items():
            if name in names and not _is_shape_input(network, name):
                profile.set_shape(name, lo, opt, hi)
        config.add_optimization_profile(profile)
    plan = builder.build_serialized_network(network, config)
    errors = [m for s, m in logger.messages if s in ("ERROR", "INTERNAL_ERROR")]
    return "built" if plan is not None else (errors[0][:300] if errors else "failed")


def _is_shape_input(network: Any, name: str) -> bool:
    return any(
        network.get_input(i).name == name and network.get_input(i).is_shape_tensor for i in range(network.num_inputs)
    )


def _dedup(messages: Any, limit: int = 400) -> list[str]:
    seen: dict[str, None] = {}
    for m in messages:
        seen.setdefault(m.replace("\n", " | ")[:limit], None)
    return list(seen)


# --------------------------------------------------------------------------------------------------------- main


@dataclass
class Row:
    """One form at one case."""

    form: str
    case: str
    standard: bool
    onnx_check: str = ""
    trt: dict[str, Any] = field(default_factory=dict)
    ort: dict[str, Any] = field(default_factory=dict)


def probe(form: Form, case: Case, workdir: Path, ccs: Sequence[str], run_trt: bool, timing: bool) -> Row:
    """Build, check, parse/build on TensorRT-RTX and run on ONNX Runtime one form at one case."""
    model = build_graph(form, case)
    row = Row(form.name, case.label, form.standard)
    try:
        onnx.checker.check_model(model, full_check=form.ort_runnable)
        row.onnx_check = "ok"
    except Exception as error:  # noqa: BLE001 - TRT-domain ops fail the checker by design
        row.onnx_check = str(error).splitlines()[0][:200]
    path = workdir / f"{form.name}_{case.dtype}_cap{case.cap}_d{case.head_dim}.onnx"
    onnx.save(model, path)
    if run_trt:
        row.trt = build_trt(form, case, path, ccs)
    if form.ort_runnable:
        row.ort = run_ort(form, case, model, timing)
    return row


def _cell_build(row: Row) -> str:
    trt = row.trt
    if not trt:
        return "-"
    if not trt.get("parse"):
        return "parse FAIL"
    builds = trt.get("builds", {})
    parts = []
    for cc, b in builds.items():
        parts.append(f"{cc} ok {b['seconds']}s {b['bytes'] // 1024}KB" if b["build"] else f"{cc} FAIL")
    return "; ".join(parts)


def _cell_notes(row: Row) -> str:
    notes = []
    trt = row.trt
    if trt.get("parse_errors"):
        notes.append(trt["parse_errors"][0][:160])
    shape_inputs = [n for n, v in trt.get("inputs", {}).items() if v["shape_tensor"]]
    if trt.get("build_without_shape_values", "built") != "built":
        notes.append("without set_shape_input values: " + trt["build_without_shape_values"][:120])
    if shape_inputs:
        built = [b for b in trt.get("builds", {}).values() if b.get("build")]
        io = built[0]["engine_io"] if built else {}
        where = [f"{n} ({io[n]['location']} memory)" if n in io else n for n in shape_inputs]
        notes.append("shape-tensor input: " + ", ".join(where))
    for b in trt.get("builds", {}).values():
        notes += [e[:200] for e in b["errors"][:1]]
        notes += [w[:160] for w in b["warnings"][:2]]
    if row.ort and not row.ort.get("ok"):
        notes.append("ORT: " + (row.ort.get("error") or "mismatch")[:160])
    return " / ".join(notes).replace("|", "\\|")


def table(rows: list[Row]) -> str:
    """The Markdown table: form x case x parse x build x K length x ORT."""
    lines = [
        "| form | case | parses | builds (all profiles) | attention K length | ORT matches | ORT decode ms "
        "(T=200: form / whole capacity) | generation-profile kernels | notes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        parses = "-" if not row.trt else ("yes" if row.trt.get("parse") else "no")
        timing = "-"
        if row.ort.get("error"):
            ort = "refused"
        elif row.ort:
            errs = [s.get("max_err_vs_numpy", math.nan) for s in row.ort.get("scenarios", {}).values()]
            worst = max(errs) if errs else math.nan
            ort = f"{'yes' if row.ort['ok'] else 'NO'} (err {worst:.1e})"
            if "decode_ms" in row.ort:
                timing = f"{row.ort['decode_ms']:.3f} / {row.ort['decode_ms_whole_capacity']:.3f}"
        else:
            ort = "n/a (TRT-only ops)"
        kv = row.trt.get("attention_kv_length", "-") if row.trt else "-"
        chain = generation_chain(row.trt) if row.trt else "-"
        if generation_chain(row.trt, 2) != "-":
            chain += "; T=CAP profile: " + generation_chain(row.trt, 2)
        lines.append(
            f"| {row.form} | {row.case} | {parses} | {_cell_build(row)} | {kv} | {ort} | {timing} | {chain} | "
            f"{_cell_notes(row)} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Probe every selected form at every case; write JSON to --out, print the Markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON results")
    parser.add_argument("--forms", nargs="*", default=[f.name for f in FORMS], help="form names (default: all)")
    parser.add_argument("--caps", nargs="*", type=int, default=[256, 2048])
    parser.add_argument("--head-dims", nargs="*", type=int, default=[64])
    parser.add_argument("--dtypes", nargs="*", default=["fp16", "fp32"], choices=sorted(_NP))
    parser.add_argument("--ccs", nargs="*", default=list(DEFAULT_CCS), help="TensorRT compute capabilities")
    parser.add_argument("--no-trt", action="store_true", help="ONNX Runtime only")
    parser.add_argument("--no-timing", action="store_true", help="skip the ONNX Runtime decode-step timing")
    parser.add_argument("--workdir", type=Path, default=None, help="where the graphs go (default: beside --out)")
    args = parser.parse_args(argv)
    unknown = set(args.forms) - {f.name for f in FORMS}
    if unknown:
        parser.error(f"unknown forms {sorted(unknown)}; known: {[f.name for f in FORMS]}")
    forms = [f for f in FORMS if f.name in args.forms]
    workdir = args.workdir or args.out.with_suffix("")
    workdir.mkdir(parents=True, exist_ok=True)
    meta = environment(not args.no_trt)
    rows: list[Row] = []
    for case in (Case(c, d, t) for t in args.dtypes for c in args.caps for d in args.head_dims):
        for form in forms:
            row = probe(form, case, workdir, args.ccs, not args.no_trt, not args.no_timing)
            rows.append(row)
            print(f"[{case.label}] {form.name}: {_cell_build(row)} ort={row.ort.get('ok', 'n/a')}", file=sys.stderr)
            payload = {"environment": meta, "forms": [dataclasses.asdict(f) for f in forms]}
            payload["rows"] = [dataclasses.asdict(r) for r in rows]
            args.out.write_text(json.dumps(payload, indent=1, default=str))
    print(table(rows))
    return 0


def environment(with_trt: bool) -> dict[str, Any]:
    """Library versions, and whether a built plan can be inspected here (IEngineInspector needs an ICudaEngine,
    which needs a GPU: the AOT plan does not deserialize on a CPU-only machine)."""
    import onnxruntime as ort

    meta: dict[str, Any] = {"onnx": onnx.__version__, "onnxruntime": ort.__version__, "numpy": np.__version__}
    if not with_trt:
        return meta
    import tensorrt_rtx as trt

    meta["tensorrt_rtx"] = trt.__version__
    logger = _logger_class()()
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    x = network.add_input("x", trt.float32, (1, 4))
    network.mark_output(network.add_identity(x).get_output(0))
    plan = builder.build_serialized_network(network, builder.create_builder_config())
    engine = trt.Runtime(logger).deserialize_cuda_engine(plan) if plan is not None else None
    errors = [m for s, m in logger.messages if s == "ERROR"]
    meta["engine_inspector"] = (
        "available" if engine is not None else f"unavailable: deserialize_cuda_engine failed ({errors[:1]})"
    )
    return meta


if __name__ == "__main__":
    raise SystemExit(main())
