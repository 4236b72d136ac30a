"""The accuracy rule anchored to PyTorch's own precision: an output the fixed tolerance fails is judged again against
how far PyTorch itself is from the answer on the same input.

* **float32** (an fp32 conversion, or float64 outputs TensorRT computes in float32): PyTorch runs the model once
  more with every float32 op computed in float64 (:class:`PrecisionMode`), the exact answer to float32's rounding.
  If the backend is as close to that answer as PyTorch float32 is, it is within twice PyTorch float32's distance
  of PyTorch float32 (the triangle inequality): an element passes within ``FACTORS["float32"]`` (2) x
  ``max |torch32 - torch64|`` on that input, the fixed ``atol``/``rtol`` being the floor. Measured against the exact
  answer itself, the output also passes where every element is within 2 x ``max |torch32 - torch64|`` of torch64
  (PyTorch float32 rounds one way, the backend the other: a backend 1.4x PyTorch's own distance from the exact answer
  can be 2.3x it from PyTorch float32; seen on a speech encoder's one element of 6,528).
* **float16 / bfloat16** (an fp16 or bf16 conversion): PyTorch runs the model with every float32 op computed in
  the low type, PyTorch's own half precision. The output passes within ``FACTORS["float16"]`` (3) x PyTorch's own
  error ``d = torch_low - torch32`` on that input: elements within 3 x ``max |d|``, the tensor's RMS error
  within 3 x ``RMS(d)``; the fixed magnitude-relative rule is the floor. 3, not 1: the graph computes some ops in
  the low type where PyTorch's CPU kernels widen internally (softmax, normalisations): issue 28 measured timm's
  csatv2 in fp16 at 0.33% of its output's RMS where PyTorch's own float16 is 0.17% (1.9x); a 1% error still
  fails wherever PyTorch's own half error is under 0.33%.

The extra PyTorch run is made only for an input on which the fixed tolerance fails (its verdict cannot change
otherwise: the anchored tolerance is never below the fixed one), once per input for all its outputs.

An op with no kernel for the wider (or half) type is computed in float32 within that run and named in the report.
A model that cannot run so at all (it raises) keeps the fixed rule, and the report says why.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import weakref
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from pipeline.runtime.io_spec import IOSpec
from pipeline.settings import DEFAULT_TOLERANCES, Tolerance

#: The dtype PyTorch runs in to anchor a tensor computed in each type.
ANCHOR_DTYPES: Mapping[str, torch.dtype] = {
    "float32": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
#: How far beyond PyTorch's own error (on the same input) an output may be, per the type it is computed in.
FACTORS: Mapping[str, float] = {"float32": 2.0, "float16": 3.0, "bfloat16": 3.0}

#: Said where PyTorch's own run in the anchor type is not finite at all (the validation error's fix reads it).
NO_ANCHOR = "no anchor, the fixed tolerance stands"

RULE = (
    "when the fixed tolerance fails on an input, PyTorch runs once more on it (float32 graphs: in float64; float16 "
    "and bfloat16 graphs: in that type) and the output passes within 2x (float32: of PyTorch float32 or of the "
    "float64 answer) or 3x (half: elements and RMS) PyTorch's own error there, never below the fixed tolerance"
)


def anchor_type(computed_in: str, tolerance: Tolerance, given: bool) -> str:
    """The type the tensor's judgement anchors to PyTorch in (``"float32"``, ``"float16"``, ``"bfloat16"``), or ""
    when it is not anchored: a tolerance the user gave or the pipeline derived is kept as it is."""
    if given or tolerance.source or computed_in not in ANCHOR_DTYPES:
        return ""
    return computed_in if tolerance == DEFAULT_TOLERANCES[computed_in] else ""


def anchored_tolerance(
    base: Tolerance, reference: np.ndarray, anchor: np.ndarray, computed_in: str, actual: np.ndarray | None = None
) -> tuple[Tolerance, str]:
    """``base`` widened to :data:`FACTORS` x PyTorch's own error ``anchor - reference`` on one input, and one line
    saying by how much; ``base`` unchanged where the anchor is not finite or the reference is all zero. PyTorch's
    own run not finite where the reference is (a model whose values leave float16's range) is said in the line:
    where no element of it is finite there is nothing to anchor to, and the line says so.

    float32 with the backend's ``actual`` output: where every element of it is within that much of the float64
    answer itself, the tolerance is widened to pass it too (the module doc), and the line says how close it is."""
    ref = np.asarray(reference, np.float64).ravel()
    own = np.asarray(anchor, np.float64).ravel() - ref
    finite = np.isfinite(own)
    scale = float(np.sqrt(np.mean(np.square(ref[np.isfinite(ref)])))) if ref.size else 0.0
    what = "float64" if computed_in == "float32" else computed_in
    lost = int(np.count_nonzero(np.isfinite(ref) & ~finite))
    overflow = (f"PyTorch's own {what} is inf or NaN on {lost} of {ref.size} elements where float32 is finite: "
                f"the model's values leave {what}'s range") if lost else ""  # fmt: skip
    if not ref.size or not finite.any() or scale == 0.0:
        if not overflow:
            return base, ""
        hint = " (bfloat16 has float32's range)" if computed_in == "float16" else ""
        return base, f"{overflow}{hint}; {NO_ANCHOR}"
    factor = FACTORS[computed_in]
    worst = float(np.abs(own[finite]).max())
    rms = float(np.sqrt(np.mean(np.square(own[finite]))))
    widened = dataclasses.replace(
        base,
        rms_atol=max(base.rms_atol, factor * worst / scale),
        rms=max(base.rms, factor * rms / scale) if base.rms else 0.0,
    )
    line = f"PyTorch {what} vs float32: max {worst:.3g}" + (f", RMS {rms / scale:.3g} x RMS" if base.rms else "")
    if computed_in == "float32" and actual is not None and not overflow:
        got = np.asarray(actual, np.float64).ravel()
        widened, line = _closer_to_exact(widened, ref, got, own, factor * worst, line)
    return widened, f"{line}; {overflow}, judged on the finite rest" if overflow else line


def _closer_to_exact(
    widened: Tolerance, ref: np.ndarray, got: np.ndarray, own: np.ndarray, allowed: float, line: str
) -> tuple[Tolerance, str]:
    """``widened`` made to pass ``got`` where every element of it is within ``allowed`` of the float64 answer
    (``ref + own``), with the line saying so; else both unchanged."""
    exact = ref + own
    if got.shape != ref.shape or not (np.isfinite(got).all() and np.isfinite(exact).all()):
        return widened, line
    gap = float(np.abs(got - exact).max())
    if gap > allowed:
        return widened, line
    scale = float(np.sqrt(np.mean(np.square(ref))))
    needed = float(np.abs(got - ref).max()) / scale * (1 + 1e-9)
    if needed <= widened.rms_atol:
        return widened, line
    return dataclasses.replace(widened, rms_atol=needed), f"{line}; the output vs float64: max {gap:.3g}"


class PrecisionMode(TorchDispatchMode):
    """Every ATen op on float32 tensors computed in ``dtype`` instead (its float32 inputs cast, a ``dtype=float32``
    argument replaced, float32 results cast): the model as if written in ``dtype``, whatever tensors it makes
    itself. An op with no kernel for ``dtype`` runs in float32 and is recorded in ``float32_ops``; an op that
    writes into a float32 tensor of the model (a cache buffer) runs in float32, so that the write lands.

    A guard the low type would erase is kept as the converted graph keeps it (the precision pass's vanishing-constant
    rule): an op with a scalar that ``dtype`` rounds to zero (``F.normalize``'s ``clamp_min(norm, 1e-12)``) runs in
    float32, its result stays float32 through views, and the first other op reading it runs in float32 and returns
    ``dtype``. Without it, PyTorch's own float16 of a model normalising a zero vector is ``0 / 0`` everywhere
    downstream (torchvision's Swin V2 where a window is padded), and no anchor at all."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype
        self.float32_ops: set[str] = set()
        self._guards: dict[int, weakref.ref[torch.Tensor]] = {}  # id -> the guard tensor (compared by identity)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        """Run ``func`` in ``self.dtype``, else (no kernel, a write into float32, a guard) in float32."""
        kwargs = kwargs or {}
        if _writes_float32(func, args, kwargs):
            return _run_in(func, args, kwargs, self.dtype, torch.float32)
        if self.dtype != torch.float64:
            guarded = self._guarded(func, args, kwargs)
            if guarded is not None:
                return guarded
        faster = _FASTER_IN_FLOAT64.get(func) if self.dtype == torch.float64 else None
        if faster is not None:
            with contextlib.suppress(NotImplementedError):
                return _run_in(faster, args, kwargs, torch.float32, self.dtype)
        try:
            return _run_in(func, args, kwargs, torch.float32, self.dtype)
        except (RuntimeError, NotImplementedError, TypeError):
            written = _WRITTEN_OUT.get(func)
            if written is not None and self.dtype == torch.float64:
                try:
                    return _run_in(written, args, kwargs, torch.float32, self.dtype)
                except NotImplementedError:
                    pass
            self.float32_ops.add(str(func))
            return _run_in(func, args, kwargs, self.dtype, torch.float32)

    def _guarded(self, func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        """``func``'s result when it is a guard or reads one (class doc), else None."""
        leaves = pytree.tree_leaves((args, kwargs))
        if any(isinstance(v, float) and v != 0 and float(torch.tensor(v, dtype=self.dtype)) == 0 for v in leaves):
            return self._mark(_run_in(func, args, kwargs, self.dtype, torch.float32))
        if not any(isinstance(v, torch.Tensor) and self._is_guard(v) for v in leaves):
            return None
        result = _run_in(func, args, kwargs, self.dtype, torch.float32)
        if func in _VIEWS:
            return self._mark(result)
        return pytree.tree_map(
            lambda v: v.to(self.dtype) if isinstance(v, torch.Tensor) and v.dtype == torch.float32 else v, result
        )

    def _mark(self, result: Any) -> Any:
        for value in pytree.tree_leaves(result):
            if isinstance(value, torch.Tensor):
                self._guards[id(value)] = weakref.ref(value)
        return result

    def _is_guard(self, tensor: torch.Tensor) -> bool:
        ref = self._guards.get(id(tensor))
        return ref is not None and ref() is tensor


#: Ops through which a guard's float32 value reaches the op that reads it (the graph's followers).
_VIEWS = frozenset(
    {
        torch.ops.aten.expand.default,
        torch.ops.aten.view.default,
        torch.ops.aten._unsafe_view.default,
        torch.ops.aten.reshape.default,
        torch.ops.aten.permute.default,
        torch.ops.aten.transpose.int,
        torch.ops.aten.unsqueeze.default,
        torch.ops.aten.squeeze.dim,
        torch.ops.aten.squeeze.dims,
        torch.ops.aten.clone.default,
        torch.ops.aten.contiguous.default,
        torch.ops.aten.alias.default,
        torch.ops.aten.detach.default,
    }
)


def _tensor(value: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """A feed's array as a tensor, float32 in ``dtype`` (the first op may check its types before dispatch)."""
    tensor = torch.from_numpy(np.asarray(value, order="C"))
    return tensor.to(dtype) if tensor.dtype == torch.float32 else tensor


def _state_in(model: torch.nn.Module, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The model's parameters and buffers by name, the float32 ones in ``dtype``."""
    named = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    return {name: t.detach().to(dtype) if t.dtype == torch.float32 else t for name, t in named.items()}


def _grouped_mm(mat_a: torch.Tensor, mat_b: torch.Tensor, offs: torch.Tensor | None = None, *rest: Any) -> Any:
    """``aten._grouped_mm`` of a 2-D ``mat_a`` [tokens, in] and a 3-D ``mat_b`` [groups, in, out] split at ``offs``
    (each group's end row) as one matrix product per group, in any float type: PyTorch's kernel takes float32 and
    half types only, and the MoE layers of transformers call it for every expert. Rows after the last group's end
    are zeros. Another form (3-D by 3-D, a bias, an output type) raises NotImplementedError."""
    if mat_a.dim() != 2 or mat_b.dim() != 3 or offs is None or any(value is not None for value in rest):
        raise NotImplementedError("only a 2-D by 3-D grouped product split by offs is written out")
    start, parts = 0, []
    for group, end in enumerate(offs.tolist()):
        parts.append(mat_a[start:end] @ mat_b[group])
        start = end
    parts.append(mat_a.new_zeros(mat_a.shape[0] - start, mat_b.shape[-1]))
    return torch.cat(parts)


#: Ops PyTorch has no float64 kernel for, written out in plain ops so that the float64 run computes them in float64
#: (else they run in float32 and the report names them): MoE layers' grouped matrix product.
_WRITTEN_OUT: dict[Any, Any] = {torch.ops.aten._grouped_mm.default: _grouped_mm}


#: The most elements the windows of a written-out depthwise convolution may hold (float64: 256 MB).
_MOST_WINDOW_ELEMENTS = 1 << 25


def _depthwise_convolution(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    transposed: bool,
    output_padding: list[int],
    groups: int,
) -> torch.Tensor:
    """``aten.convolution`` of a depthwise 1-D or 2-D convolution (``groups`` = input channels, any channel multiplier,
    stride, padding and dilation) as windows times taps, summed: PyTorch's float64 kernel for it is 10-50x slower than
    its float32 one (a Mamba or short-convolution layer's, a ConvNeXt block's), so that a float64 run spent minutes in
    it. Any other form raises NotImplementedError (the op's own kernel runs)."""
    spatial = input.dim() - 2
    if transposed or groups == 1 or groups != input.shape[1] or spatial not in (1, 2) or weight.shape[1] != 1:
        raise NotImplementedError("only a depthwise 1-D or 2-D convolution is written out")
    padded = torch.nn.functional.pad(input, [side for pad in reversed(padding) for side in (pad, pad)])
    windows = padded
    for axis, (size, step, gap) in enumerate(zip(weight.shape[2:], stride, dilation, strict=True)):
        windows = windows.unfold(2 + axis, gap * (size - 1) + 1, step)
    taken: tuple[Any, ...] = (Ellipsis, *(slice(None, None, gap) for gap in dilation))
    windows = windows[taken]  # each window's taps
    if windows.numel() * (weight.shape[0] // groups) > _MOST_WINDOW_ELEMENTS:  # the kernel's memory, not 10x more
        raise NotImplementedError("the windows of this convolution would take more memory than its kernel allows")
    if weight.shape[0] != groups:  # a channel multiplier: each input channel's windows for each of its outputs
        windows = windows.repeat_interleave(weight.shape[0] // groups, dim=1)  # [N, C_out, *out, *kernel]
    taps = weight.reshape(weight.shape[0], *([1] * spatial), *weight.shape[2:])
    out = (windows * taps).sum(dim=tuple(range(-spatial, 0)))
    return out if bias is None else out + bias.reshape(1, -1, *([1] * spatial))


#: Ops whose float64 kernel is far slower than their float32 one, written out for the float64 run (each may decline a
#: form it does not write out: NotImplementedError, and the op's own kernel runs).
_FASTER_IN_FLOAT64: dict[Any, Any] = {torch.ops.aten.convolution.default: _depthwise_convolution}


def _run_in(func: Any, args: Any, kwargs: dict[str, Any], old: torch.dtype, new: torch.dtype) -> Any:
    """``func`` with ``old`` float tensors (and ``dtype=old``) as ``new``, its ``old`` results cast to ``new``."""

    def cast(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.dtype == old:
            return value.to(new)
        return new if value is old else value

    args, kwargs = pytree.tree_map(cast, (args, kwargs))
    result = func(*args, **kwargs)
    return pytree.tree_map(lambda v: v.to(new) if isinstance(v, torch.Tensor) and v.dtype == old else v, result)


def _writes_float32(func: Any, args: Any, kwargs: dict[str, Any]) -> bool:
    """Whether ``func`` writes into one of its float32 tensor arguments (in place or ``out=``)."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return False
    values = list(args) + [kwargs.get(a.name) for a in schema.arguments[len(args) :]]
    for argument, value in zip(schema.arguments, values, strict=False):
        alias = argument.alias_info
        if alias is not None and alias.is_write and isinstance(value, torch.Tensor) and value.dtype == torch.float32:
            return True
    return False


class AnchorRuns:
    """PyTorch's own outputs in each anchor type, made on demand: ``outputs(computed_in, feed)`` runs ``model`` on
    ``feed`` with its float32 parameters and buffers in the anchor type (one copy per type, made on first use) under
    :class:`PrecisionMode`; a type the model cannot run in is remembered with PyTorch's message (``refused``) and
    not tried again. ``runs`` and ``seconds`` count what it cost."""

    def __init__(self, model: torch.nn.Module, io: IOSpec) -> None:
        self.model, self.io = model, io
        self.runs, self.seconds = 0, 0.0
        self.float32_ops: set[str] = set()
        self.refused: dict[str, str] = {}
        self._state: dict[torch.dtype, dict[str, torch.Tensor]] = {}

    def outputs(self, computed_in: str, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray] | None:
        """PyTorch's outputs on ``feed`` with its float32 ops in the anchor type of ``computed_in``, or None."""
        if computed_in in self.refused:
            return None
        dtype = ANCHOR_DTYPES[computed_in]
        mode = PrecisionMode(dtype)
        start = time.perf_counter()
        try:
            with torch.no_grad():
                if dtype not in self._state:
                    self._state[dtype] = _state_in(self.model, dtype)
                state = self._state[dtype]
                device = next(iter(state.values())).device if state else torch.device("cpu")
                tensors = {k: _tensor(v, dtype).to(device) for k, v in feed.items()}
                args, kwargs = self.io.feed_to_call(tensors)
                with mode:
                    result = torch.func.functional_call(self.model, state, args, kwargs)
        except Exception as error:  # the model cannot run in that type: the fixed rule stands, and says why
            self.refused[computed_in] = f"{type(error).__name__}: {' '.join(str(error).split())[:200]}"
            return None
        finally:
            self.seconds += time.perf_counter() - start
        self.runs += 1
        self.float32_ops |= mode.float32_ops
        leaves = [leaf for leaf in pytree.tree_leaves(result) if isinstance(leaf, torch.Tensor)]
        return {
            spec.name: leaf.detach().cpu().to(torch.float64).numpy()
            for spec, leaf in zip(self.io.outputs, leaves, strict=True)
        }

    def note(self, computed_in: str) -> str:
        """What the report says about the anchor runs of ``computed_in`` (why none ran, ops left in float32)."""
        what = "float64" if computed_in == "float32" else computed_in
        if computed_in in self.refused:
            return f"PyTorch cannot run the model in {what} ({self.refused[computed_in]}): the fixed tolerance stands"
        if self.float32_ops:
            return f"ops computed in float32 in PyTorch's {what} run (no kernel): {', '.join(sorted(self.float32_ops))}"
        return ""
