"""The one frozen settings object that travels down every stage.

It lives in ``converters`` (the lowest package) so that converters, passes and the pipeline all read the same
object; ``pipeline`` re-exports it. Environment variables are read here, once, and nowhere else.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from converters.errors import InputError
from converters.generation_settings import GenerationSettings, normalise_generation
from converters.setting_choices import (
    Backend,
    CalibrationMethod,
    CheckParser,
    Fallback,
    HardwareCompatibility,
    OrtInt8ConvOutputs,
    Precision,
    PrecisionIO,
    QuantizeFallback,
    check_values,
)
from converters.shapes import DynamicDim, ProfileRange, normalise_dynamic, normalise_profiles


@dataclass(frozen=True)
class Tolerance:
    """An element passes when ``|a - b| <= max(atol, rms_atol * RMS(b))`` or ``|a - b| <= rtol * |b|`` (b: PyTorch's
    value, RMS over the tensor's finite values on one input); and with ``rms`` > 0 the tensor passes only when, on
    every input, ``RMS(a - b) <= max(atol, rms * RMS(b))`` too. ``rms_atol`` and ``rms`` are 0 (unused) unless
    given: ``(atol, rtol)`` pairs are the plain elementwise rule. ``source`` says where a tolerance the pipeline
    derived came from (the accuracy report shows it instead of "tolerance given for ..."); it is not compared."""

    atol: float
    rtol: float
    rms_atol: float = 0.0
    rms: float = 0.0
    source: str = field(default="", compare=False)


#: Default tolerances per output dtype, written into every accuracy report. fp32 is tight enough that
#: "matches PyTorch to 1e-4 relative" holds; integer and bool outputs must match exactly.
#: float16 and bfloat16 (the types an fp16/bf16 graph computes in) are judged relative to each tensor's magnitude:
#: an element may be off by 1% of the tensor's RMS (float16; an absolute atol meant for values near 1 fails
#: LayerNorm outputs near 0 whose neighbours reach 4), and the tensor's RMS error must stay within 0.2% of its RMS
#: (4 float16 steps: BERT and Llama in fp16 measure 0.03%, a real 1% error in one block measures 1%, so the
#: elementwise rtol alone, which passes any uniform 1% error, is not enough). bfloat16 has 8x fewer mantissa
#: steps: 8x the figures.
#: The short names ``convert`` and ``pipeline.load`` take for ONNX Runtime's thread settings.
RUNTIME_ALIASES = {"threads": "ort_intra_op_threads", "spinning": "ort_allow_spinning"}

DEFAULT_TOLERANCES: Mapping[str, Tolerance] = {
    "float64": Tolerance(atol=1e-9, rtol=1e-7),
    "float32": Tolerance(atol=1e-5, rtol=1e-4),
    "float16": Tolerance(atol=1e-3, rtol=1e-2, rms_atol=1e-2, rms=2e-3),
    "bfloat16": Tolerance(atol=1e-2, rtol=5e-2, rms_atol=8e-2, rms=1.6e-2),
    "int64": Tolerance(atol=0.0, rtol=0.0),
    "int32": Tolerance(atol=0.0, rtol=0.0),
    "int8": Tolerance(atol=0.0, rtol=0.0),
    "uint8": Tolerance(atol=0.0, rtol=0.0),
    "bool": Tolerance(atol=0.0, rtol=0.0),
}

#: The type a graph converted with ``precision=...`` computes its float values in; their outputs are judged with
#: that type's tolerance (a float32 output of an fp16 graph carries float16's error). float64 values compute in
#: float32 on TensorRT, which has no float64 arithmetic: :data:`FLOAT64_COMPUTED_IN`.
COMPUTE_TYPES: Mapping[str, str] = {"fp16": "float16", "bf16": "bfloat16"}
FLOAT64_COMPUTED_IN = "float32"


def _default_cache_dir() -> str:
    return str(Path(_environment()["PIPELINE_CACHE_DIR"]).expanduser())


@functools.cache
def _environment() -> Mapping[str, str]:
    """The only place the project reads environment variables."""
    return {"PIPELINE_CACHE_DIR": os.environ.get("PIPELINE_CACHE_DIR", "~/.cache/torch-trt-pipeline")}


#: The groups settings belong to, in the order of the flow (``Settings.grouped()``, the artifact's metadata).
GROUPS: tuple[str, ...] = (
    "backend",
    "export",
    "passes",
    "precision",
    "check",
    "tensorrt",
    "onnxruntime",
    "validation",
    "generation",
)


def option(group: str, default: Any = MISSING, *, engine: bool = False, default_factory: Any = MISSING) -> Any:
    """A settings field with its group and whether it changes a built engine.

    ``engine=True`` puts the field in :meth:`Settings.engine_settings`, from which the engine cache key and the
    artifact's record of how its engine was built are derived: a new setting that changes the engine is marked
    here, on the field, and nowhere else.
    """
    if group not in GROUPS:
        raise ValueError(f"unknown settings group {group!r}")
    metadata = {"group": group, "engine": engine}
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class Settings:
    """Everything a conversion can be told. ``pipeline.convert(model, sample, **settings)`` builds one.

    ``dynamic`` may be given as ``{"x": {0: ("batch", 1, 8, 32)}}`` (input name -> axis -> (name, min, opt,
    max)); it is normalised to a tuple of :class:`DynamicDim`. ``tolerances`` maps a dtype name (``"float32"``)
    or an output name to a :class:`Tolerance` or an ``(atol, rtol)`` pair; it is merged over the defaults.
    ``profiles`` gives a TensorRT engine several optimization profiles, each a mapping of dynamic dimension names
    to (min, opt, max) within the declared range (a dimension not named keeps its declared range); empty: one
    profile from ``dynamic``. ``generation`` (:class:`GenerationSettings`, or a dict of its fields) converts a
    transformers causal LM as one cached decoder step with ``generate()``.
    """

    backend: Backend = option("backend", "auto")
    dynamic: tuple[DynamicDim, ...] = option("export", (), engine=True)
    generation: GenerationSettings | None = option("generation", None, engine=True)
    profiles: tuple[tuple[ProfileRange, ...], ...] = option("tensorrt", (), engine=True)
    # Values of inputs TensorRT reads as shape tensors (their values size tensors in the graph: Pixtral's image_sizes,
    # read with .item() to crop its patches): every optimization profile must hold them, and the engine takes exactly
    # these. {name: values} or ((name, values), ...). A TensorRT conversion that gives none takes the sample's values
    # of such inputs (pipeline.backends.tensorrt.shape_inputs).
    shape_tensor_values: tuple[tuple[str, tuple[int, ...]], ...] = option("tensorrt", (), engine=True)
    validate: bool = option("validation", True)
    validation_inputs: int = option("validation", 3)
    seed: int = option("validation", 0)
    tolerances: Mapping[str, Tolerance] = option("validation", default_factory=dict)
    # A float output the default tolerance fails on an input is judged again against PyTorch's own error there: a
    # float64 run for float32 graphs, a float16/bfloat16 run for fp16/bf16 ones (README: the accuracy rule).
    accuracy_anchor: bool = option("validation", True)
    opset: int | None = option("export", None)
    fold_size_threshold: int = option("passes", 4 << 20)
    # Weights totalling more than this many bytes are exported to an external data file in a private directory
    # under weights_dir (default: the system's temporary directory) and stay on disk through the passes, the
    # sessions and the artifact: needed above protobuf's 2 GiB limit, and it keeps the weights out of memory.
    external_data_threshold: int = option("export", 1 << 30)
    weights_dir: str | None = option("export", None)
    max_pass_iterations: int = option("passes", 4)
    ort_providers: tuple[str, ...] = option("onnxruntime", ("CPUExecutionProvider",))
    ort_intra_op_threads: int | None = option("onnxruntime", None)
    # ONNX Runtime's intra-op threads spin-wait between ops (and calls) by default: lower latency on an idle machine,
    # a busy core per thread under load, taken from anything else running (PyTorch eager in `pipeline bench`).
    # False lets them sleep ("session.intra_op.allow_spinning" = "0"); None keeps ONNX Runtime's default, except for
    # a generation module, whose decode loop calls a small step many times: off (it halved batch-1 decode at 2 threads
    # on a shared 2-core machine). Both are runtime choices: pipeline.load(path, threads=, spinning=) overrides them.
    ort_allow_spinning: bool | None = option("onnxruntime", None)
    # ONNX Runtime's weight prepacking (faster matmuls, a second copy of every weight). None: on, except for a graph
    # with external weights, whose data file is then memory-mapped instead of copied (see external_data_threshold).
    # A float32 generation step's prepacked session is made in a background thread, the calls running unprepacked
    # until it is ready (pipeline.runtime.ort.prepacking); False: never prepacked, no background build.
    ort_prepack_weights: bool | None = option("onnxruntime", None)
    # A cached decoder step (generation=) on ONNX Runtime's CPU provider runs each layer's cache write and attention as
    # com.microsoft::GroupQueryAttention, which reads only the filled part of the cache (pipeline.runtime.ort.
    # grouped_attention): a decode step costs what the cache holds, not max_length. False runs module.onnx's ONNX
    # Attention over the whole capacity (the graph TensorRT builds). A runtime choice, like the threads.
    ort_grouped_attention: bool = option("onnxruntime", True)
    # True: a generation step on ONNX Runtime's CPU provider with float32 weights runs its single-row, single-token
    # steps (batch-1 decode) on a second session of the same graph without weight prepacking: the one every call
    # runs on while the prepacked session is made, kept after (pipeline.runtime.ort.executor.OnnxRuntimeExecutor.
    # row_session). Off by default: the prepacked session, which
    # runs the merged projections apart, is as fast for one row (the issue-35 Llama, one thread, quiet machine: 64
    # tokens in 0.665 against 0.671 s) and one session saves memory. A runtime choice, like the threads.
    ort_row_session: bool = option("onnxruntime", False)
    # INT8 on ONNX Runtime (pipeline.runtime.ort.int8, rewrite 0): "requantize" gives the float output of a quantized
    # convolution before a residual Add its own calibrated INT8 pair in ONNX Runtime's session (QLinearConv +
    # QLinearAdd: 1.4x faster on the bundled CNN, one 8-bit rounding more than TensorRT's fused kernel); "exact" keeps
    # it float, as TensorRT computes it. module.onnx, the graph TensorRT builds, is the same either way.
    ort_int8_conv_outputs: OrtInt8ConvOutputs = option("onnxruntime", "requantize")
    trt_workspace_bytes: int | None = option("tensorrt", None, engine=True)
    trt_builder_optimization_level: int | None = option("tensorrt", None, engine=True)
    # TensorRT build (pipeline.backends.tensorrt.build). TF32 is off unless asked for: it would break fp32 tolerances.
    # trt_timing_cache=None keeps one timing cache per TensorRT version and GPU in cache_dir. Compatibility
    # options let an engine run on other GPUs (ampere_plus) or later TensorRT releases of the same major.
    trt_tactic_shared_memory_bytes: int | None = option("tensorrt", None, engine=True)
    trt_tf32: bool = option("tensorrt", False, engine=True)
    trt_timing_cache: str | None = option("tensorrt", None)
    trt_version_compatible: bool = option("tensorrt", False, engine=True)
    trt_hardware_compatibility: HardwareCompatibility = option("tensorrt", "none", engine=True)
    trt_engine_cache: bool = option("tensorrt", True)
    # Bytes of engines the engine cache keeps in cache_dir; past it the least recently used are removed after each
    # store (5 GiB: Torch-TensorRT's engine_cache_size default). None or 0: no bound. Timing caches are not counted.
    trt_engine_cache_size: int | None = option("tensorrt", 5 << 30)
    # TensorRT-RTX (backend="tensorrt-rtx"): the GPU compute capabilities the engine targets, e.g. ("8.9",) or
    # ("8.6", "12.0"); () is TensorRT-RTX's portable default (8.0, 8.6, 8.9, 12.0 and later). With
    # require_engine_runtime, an engine that cannot run here (no CUDA, unsupported GPU) is an error instead of
    # running the same final graph on ONNX Runtime.
    trt_compute_capabilities: tuple[str, ...] = option("tensorrt", (), engine=True)
    require_engine_runtime: bool = option("backend", False)
    # Nodes a TensorRT backend cannot take (the check stage's parser rejects them, TensorRT-RTX loads no plugins) or
    # must not take (fallback_ops: ONNX op types): with fallback="onnxruntime" the module runs TensorRT engines for
    # the segments TensorRT takes and ONNX Runtime for the rest (pipeline.backends.segments), with a warning and
    # report.segments; TensorRT runs of fewer than min_segment_size compute nodes join ONNX Runtime.
    # fallback="error" refuses such a graph with the parser's reasons.
    fallback: Fallback = option("backend", "onnxruntime")
    fallback_ops: tuple[str, ...] = option("backend", ())
    min_segment_size: int = option("backend", 5)
    # Engine options (README "Engine options"). strip_weights: a weight-stripped plan, refit from the graph's weights
    # when the engine is loaded (an artifact keeps every weight once, in model.onnx). refittable: an engine that
    # pipeline.refit(module, new_model) can give new weights. weight_streaming_budget: bytes of weights kept on the GPU
    # (-1: TensorRT's automatic budget), the rest streamed from host memory; None builds without weight streaming.
    # sparse_weights: TensorRT may run 2:4-sparse weights on sparse tensor cores. cuda_graphs: the engine runs as a
    # CUDA graph captured per input shape. trt_runtime_cache: TensorRT-RTX keeps its JIT-compiled kernels in a file
    # (cache_dir, and beside a loaded artifact), so the next process skips the compilation.
    strip_weights: bool = option("tensorrt", False, engine=True)
    refittable: bool = option("tensorrt", False, engine=True)
    weight_streaming_budget: int | None = option("tensorrt", None)  # the engine's flag is derived: build_options
    sparse_weights: bool = option("tensorrt", False, engine=True)
    cuda_graphs: bool = option("tensorrt", False)
    trt_runtime_cache: bool = option("tensorrt", True)
    # Run ONNX Runtime on the sample after every pass that changes the graph; the first pass that moves the
    # outputs beyond tolerance (vs the exported graph) is named in a ConversionError.
    debug_passes: bool = option("passes", False)
    # The TensorRT version the static parser check targets; None: the installed one, else 11.1 (the matrix's).
    trt_check_version: str | None = option("check", None)
    # Which parser judges the final graph: "auto" is the real parser of an importable TensorRT, else of TensorRT-RTX,
    # else the static table; "static" never imports TensorRT (pipeline.compatibility.judge).
    check_parser: CheckParser = option("check", "auto")
    cache_dir: str = option("tensorrt", default_factory=_default_cache_dir)
    # Precision (README "Precision"): "fp16"/"bf16" rewrite the graph to that type, graph inputs and outputs keep
    # theirs. float32 islands come from rules (precision_rules), keep_fp32 (node names, op types or PyTorch module
    # paths; "node:", "op:", "module:" say which), measurement on calibration inputs (precision_measure: a tensor
    # whose max |x| times precision_range_margin exceeds the type's range) and, when the result misses the
    # tolerance on the calibration inputs, an accuracy-driven search (precision_search). Calibration: the sample and
    # calibration_inputs random inputs drawn like it, unless convert(calibration=...) is given. Less than
    # precision_min_share of the compute in the low type is a warning, or a ConversionError with precision_strict.
    precision: Precision = option("precision", "fp32")
    keep_fp32: tuple[str, ...] = option("precision", ())
    precision_rules: bool = option("precision", True)
    precision_measure: bool = option("precision", True)
    precision_range_margin: float = option("precision", 4.0)
    precision_search: bool = option("precision", True)
    calibration_inputs: int = option("precision", 2)
    precision_min_share: float = option("precision", 0.5)
    precision_strict: bool = option("precision", False)
    # "model": graph inputs and outputs keep the model's types (casts at the boundary); "low": float32 inputs and
    # outputs become the low type (float16), so the module takes and returns float16 tensors.
    precision_io: PrecisionIO = option("precision", "model")
    # Quantization (README "Quantization (INT8, FP8)"): precision="int8"/"fp8" puts Q/DQ pairs at the inputs of
    # MatMul/Gemm/Conv/ConvTranspose (weights per channel, activations per tensor); the other ops run in
    # quantize_fallback. calibration_method "auto" is "mse" for int8 and "max" for fp8; "percentile" clips at
    # calibration_percentile. Calibration inputs are those of fp16 (calibration_inputs, convert(calibration=...)).
    quantize_fallback: QuantizeFallback = option("precision", "fp16")
    calibration_method: CalibrationMethod = option("precision", "auto")
    calibration_percentile: float = option("precision", 99.99)
    # 4-bit weights (README "4-bit weights (INT4, NVFP4)"): precision="int4" stores MatMul/Gemm weights as symmetric
    # INT4 with one scale per block_size input channels (32 to 128 for TensorRT; None: 128), "nvfp4" as FP4 E2M1 with
    # FP8 scales per block of 16 (block_size None becomes 16; any other value is an error) and a float32 scale per
    # tensor; activations stay in quantize_fallback (W4A16).
    # calibration_method "auto" is "max"; "awq" searches activation-aware scales. keep_head leaves the output head
    # (a MatMul/Gemm whose output is a graph output) in quantize_fallback. ort_int4_accuracy_level is the accuracy
    # level of ONNX Runtime's MatMulNBits, into which its session fuses the INT4 weights: 1 computes in float32
    # (exact), 4 quantizes activations to int8 (faster, ~1% error). nvfp4_activations (precision="nvfp4"): W4A4,
    # activations quantized to NVFP4 at run time (TensorRT's TRT_FP4DynamicQuantize, compute capability 12.x).
    # quantize_embeddings: Gather tables in 4 bits too (a tied table quantized once).
    block_size: int | None = option("precision", None)
    keep_head: bool = option("precision", True)
    nvfp4_activations: bool = option("precision", False)
    quantize_embeddings: bool = option("precision", False)
    ort_int4_accuracy_level: int = option("onnxruntime", 1)

    def __post_init__(self) -> None:
        check_values(self)  # each value's type and range (converters.setting_choices)
        object.__setattr__(self, "dynamic", normalise_dynamic(self.dynamic))
        object.__setattr__(self, "generation", normalise_generation(self.generation))
        object.__setattr__(self, "profiles", normalise_profiles(self.profiles, self.dynamic))
        object.__setattr__(self, "tolerances", _normalise_tolerances(self.tolerances))
        object.__setattr__(self, "shape_tensor_values", _normalise_shape_values(self.shape_tensor_values))

    def with_runtime(self, threads: int | None = None, spinning: bool | None = None) -> Settings:
        """These settings with the runtime's own choices: ONNX Runtime's intra-op ``threads`` and whether they
        ``spinning``-wait (None: keep the converted module's). What ``pipeline.load(path, threads=, spinning=)``
        applies: nothing of the graph or engine depends on them."""
        changes: dict[str, Any] = {}
        if threads is not None:
            changes["ort_intra_op_threads"] = threads
        if spinning is not None:
            changes["ort_allow_spinning"] = spinning
        return dataclasses.replace(self, **changes) if changes else self

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, Any]) -> Settings:
        """Build settings from ``convert``'s keyword arguments; an unknown name is an error with the list.

        ``threads`` and ``spinning`` are the short names ``pipeline.load`` takes too, for ``ort_intra_op_threads``
        and ``ort_allow_spinning``."""
        kwargs = dict(kwargs)
        for short, name in RUNTIME_ALIASES.items():
            if short in kwargs:
                if name in kwargs:
                    raise InputError(f"both {short}= and {name}= were given", fix=f"pass one: {short}= is {name}=")
                kwargs[name] = kwargs.pop(short)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise InputError(
                f"unknown setting(s) {', '.join(unknown)}", fix=f"known settings are: {', '.join(sorted(known))}"
            )
        return cls(**kwargs)

    def grouped(self) -> dict[str, dict[str, Any]]:
        """The settings by group (``GROUPS``), e.g. ``{"precision": {"precision": "fp16", ...}, ...}``."""
        out: dict[str, dict[str, Any]] = {group: {} for group in GROUPS}
        for f in fields(self):
            out[f.metadata["group"]][f.name] = getattr(self, f.name)
        return out

    def engine_settings(self) -> dict[str, Any]:
        """Every setting marked ``engine=True``: what, besides the graph, decides a built engine."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.metadata["engine"]}

    def tolerance_for(self, output_name: str, dtype: str) -> Tolerance:
        """The tolerance for one output: by output name, else by dtype, else the fp32 default."""
        if output_name in self.tolerances:
            return self.tolerances[output_name]
        merged = {**DEFAULT_TOLERANCES, **self.tolerances}
        return merged.get(dtype, DEFAULT_TOLERANCES["float32"])

    def with_input_ranks(self, ranks: Mapping[str, int]) -> Settings:
        """These settings with every negative dynamic axis counted from the end of its input's rank (``-2`` of a
        2-D input is axis 0), so that every later stage, the module's range check and the artifact agree."""
        dims = tuple(
            dataclasses.replace(d, axis=d.axis + ranks[d.input]) if d.axis < 0 and d.input in ranks else d
            for d in self.dynamic
        )
        return self if dims == self.dynamic else dataclasses.replace(self, dynamic=dims)

    def dims_of(self, input_name: str) -> dict[int, DynamicDim]:
        """The declared dynamic dimensions of one graph input, by axis."""
        return {d.axis: d for d in self.dynamic if d.input == input_name}


def _normalise_shape_values(given: Any) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """``shape_tensor_values`` as ((name, flat integer values), ...), sorted by name."""
    pairs = given.items() if isinstance(given, Mapping) else given
    try:
        normalised = {str(name): tuple(int(v) for v in np.asarray(values).ravel()) for name, values in pairs}
    except (TypeError, ValueError) as exc:
        raise InputError(
            f"shape_tensor_values must map input names to integer values, got {given!r}",
            fix="pass e.g. shape_tensor_values={'image_sizes': [[448, 448]]}",
        ) from exc
    return tuple(sorted(normalised.items()))


def _normalise_tolerances(tolerances: Any) -> Mapping[str, Tolerance]:
    if not isinstance(tolerances, Mapping):
        raise InputError(
            f"tolerances must be a mapping, got {type(tolerances).__name__}",
            fix="write tolerances={'float32': (1e-4, 1e-3), 'logits': (1e-3, 1e-2)} (dtype or output -> (atol, rtol))",
        )
    out: dict[str, Tolerance] = {}
    for key, value in dict(tolerances).items():
        fix = f"write tolerances={{{key!r}: (1e-4, 1e-3)}} (atol, rtol: finite numbers >= 0)"
        try:
            atol, rtol = (value.atol, value.rtol) if isinstance(value, Tolerance) else value
            atol, rtol = float(atol), float(rtol)
            extra = (float(value.rms_atol), float(value.rms)) if isinstance(value, Tolerance) else (0.0, 0.0)
        except (TypeError, ValueError):
            raise InputError(
                f"tolerance for {key!r} must be (atol, rtol) or Tolerance with two numbers, got {value!r}", fix=fix
            ) from None
        if not (math.isfinite(atol) and math.isfinite(rtol) and atol >= 0 and rtol >= 0):
            raise InputError(f"tolerance for {key!r} must be finite and >= 0, got atol={atol}, rtol={rtol}", fix=fix)
        if not all(math.isfinite(x) and x >= 0 for x in extra):
            raise InputError(f"tolerance for {key!r} must have finite rms_atol and rms >= 0, got {value!r}", fix=fix)
        source = value.source if isinstance(value, Tolerance) else ""
        out[str(key)] = Tolerance(atol, rtol, *extra, source=source)
    return out
