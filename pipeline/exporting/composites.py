"""Composite PyTorch functions traced, during torch.export, through an equivalent Python form the graph can hold.

Some composite ops are written (in C++) with a branch on a tensor's value, or produce a data-dependent size on the
way to a static one; torch.export then fails or keeps an op no ONNX translation has. Where the branch or the size
is known from the static shapes and arguments alone, the same computation written without it is exact:

- ``torch.cov`` without weights: the degrees of freedom are ``n - correction`` (a number, not a tensor, so no
  ``aten.equal`` on ``norm_factor <= 0``); the same ops in the same order as PyTorch's ``cov``.
- ``torch.corrcoef``: PyTorch's ``corrcoef`` on that ``cov``.
- ``torch.combinations`` of a 1-d tensor of static length: the ``C(n, r)`` index tuples are a constant table,
  and the result a gather with it (PyTorch's goes through ``masked_select``, which has no static output size).

- ``torch.stft`` of real input with ``return_complex=False``: frames (a gather with a constant index table), the
  window, and one ``MatMul`` with the DFT matrix (cos and sin of ``2*pi*(k*n mod N)/N`` computed in float64), as
  accurate as PyTorch's FFT. The exporter's ``STFT`` node runs on ONNX Runtime with errors of up to 1e-6 of the
  spectrum's magnitude (4.2e-05 on a spectrum of 38, against PyTorch's 2.7e-06, both measured against float64).

- ``torch.nn.functional.gaussian_nll_loss`` with a tensor variance: PyTorch raises when an entry is negative
  (``torch.any(var < 0)``, a branch on the data); a graph cannot raise, so, as the linear algebra converters do
  where PyTorch raises on the data, the loss is NaN there (and in a mean or sum over it). The same values
  elsewhere.

- ``Tensor.to`` that changes nothing (the tensor already has that dtype and device, no copy asked): the tensor
  itself, as PyTorch returns it eagerly. Traced, each such call is a conversion node and a dtype assertion that
  every later stage of the export carries until the optimizer drops the no-op cast: a float32 RMSNorm converts its
  input to float32 and back, twice per decoder layer (a fifth of the nodes torch.export traces of a cached Llama
  step, and of the time the exporter's decompositions take).

- ``Tensor.data`` read in ``forward`` (CogVideoX's patch embedding builds its positional table for another size and
  writes it through ``joint.data[:, n:].copy_(table)``): ``detach()``, the same memory without autograd (the export
  runs without gradients). torch.export traces ``.data`` as a fresh constant and fails on the write ("We found a
  fake tensor in the exported program constant's list"); a ``detach`` view keeps the write in the graph.

- ``torch.nn.functional.group_norm`` of a non-contiguous input (ConsistencyDecoderVAE's UNet): PyTorch's CPU kernel
  takes any layout, its tracing kernel asserts a contiguous one ("Expected X.is_contiguous(memory_format)"); the
  input is made contiguous first, the same values.

- ``Tensor.view`` and ``reshape`` of a tensor whose symbolic strides PyTorch wrote with a ``Min`` (a view that merged
  dimensions: ``x.view(-1, hidden)`` of a contiguous ``[batch, sequence, hidden]`` has the stride
  ``Min(hidden, hidden*sequence)``), yet contiguous as far as the shapes' ranges prove: viewed again (Aria's mixture of
  experts views its flattened tokens back to ``[batch, sequence, hidden]``), PyTorch's contiguity check multiplies
  the ``Min`` into a guard its solver cannot prove (``s*Min(32, 32*s) == 32*s``), and a dynamic sequence fails. The
  view is taken of a contiguous copy (plain strides; ``aten.clone``, an ONNX ``Identity``): the same values.

Anything else (weights, empty results, complex input or output) is left to PyTorch, and fails or exports as before.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from passes.parser_fixes.dft import MAX_DFT_MATRIX_BYTES

logger = logging.getLogger(__name__)


def _cov(x: Any, correction: int = 1, fweights: Any = None, aweights: Any = None) -> Any:
    if fweights is not None or aweights is not None or not isinstance(x, torch.Tensor) or x.dim() > 2:
        return NotImplemented
    observations = x.view(1, -1) if x.dim() < 2 else x
    count = observations.shape[1]
    average = observations.sum(1) / count
    degrees = max(count - correction, 0)  # PyTorch warns and divides by zero when there are none left
    centred = observations - average.unsqueeze(1)
    return torch.true_divide(torch.mm(centred, centred.t().conj()), degrees).squeeze()


def _corrcoef(x: Any) -> Any:
    if not isinstance(x, torch.Tensor) or x.is_complex() or x.dim() > 2:
        return NotImplemented
    c = _cov(x)
    if c.dim() == 0:  # one variable: nan where the variance is nan, inf or 0, else 1
        return c / c
    stddev = torch.sqrt(c.diagonal())
    c = c / stddev.view(-1, 1)
    c = c / stddev.view(1, -1)
    return torch.clip(c, -1, 1)


def _combinations(x: Any, r: int = 2, with_replacement: bool = False) -> Any:
    if not isinstance(x, torch.Tensor) or x.dim() != 1 or r < 1:
        return NotImplemented
    choose = itertools.combinations_with_replacement if with_replacement else itertools.combinations
    table = list(choose(range(x.shape[0]), r))
    if not table:  # an empty result: nothing to gather
        return NotImplemented
    return x[torch.tensor(table, dtype=torch.long, device=x.device)]


def _stft(  # noqa: PLR0913 -- torch.stft's own signature
    x: Any,
    n_fft: int,
    hop_length: int | None = None,
    win_length: int | None = None,
    window: Any = None,
    center: bool = True,
    pad_mode: str = "reflect",
    normalized: bool = False,
    onesided: bool | None = None,
    return_complex: bool | None = None,
    align_to_window: bool | None = None,
) -> Any:
    real = isinstance(x, torch.Tensor) and not x.is_complex() and x.dim() in (1, 2)
    if not real or return_complex is not False or align_to_window is not None or onesided is False:
        return NotImplemented
    if window is not None and (window.is_complex() or window.dim() != 1):
        return NotImplemented
    if n_fft * (n_fft // 2 + 1) * 2 * x.element_size() > MAX_DFT_MATRIX_BYTES:  # as the DFT rewrite: too large
        return NotImplemented
    hop = hop_length or n_fft // 4
    signal = x.unsqueeze(0) if x.dim() == 1 else x
    if center:
        pad = n_fft // 2
        signal = torch.nn.functional.pad(signal.unsqueeze(1), [pad, pad], mode=pad_mode).squeeze(1)
    count = 1 + (signal.shape[-1] - n_fft) // hop
    if count < 1:
        return NotImplemented
    starts = torch.arange(count).unsqueeze(1) * hop  # a constant: (frames, n_fft) positions
    frames = signal[:, starts + torch.arange(n_fft)]
    if window is not None:
        left = (n_fft - window.shape[0]) // 2
        frames = frames * torch.nn.functional.pad(window, [left, n_fft - window.shape[0] - left])
    spectrum = torch.matmul(frames, _dft_matrix(n_fft, normalized, frames.dtype))  # (batch, frames, bins * 2)
    result = spectrum.view(*spectrum.shape[:-1], -1, 2).transpose(1, 2)  # (batch, bins, frames, 2)
    return result.squeeze(0) if x.dim() == 1 else result


def _dft_matrix(n_fft: int, normalized: bool, dtype: torch.dtype) -> torch.Tensor:
    """``[n_fft, bins * 2]``: for each one-sided bin ``k`` the columns ``cos`` and ``-sin`` of ``2*pi*k*n/n_fft``,
    the argument reduced modulo ``n_fft`` in integers and the values computed in float64."""
    n = torch.arange(n_fft, dtype=torch.int64)
    k = torch.arange(n_fft // 2 + 1, dtype=torch.int64)
    angle = (torch.outer(n, k) % n_fft).to(torch.float64) * (2 * math.pi / n_fft)
    matrix = torch.stack((torch.cos(angle), -torch.sin(angle)), dim=-1).reshape(n_fft, -1)
    if normalized:
        matrix = matrix / math.sqrt(n_fft)
    return matrix.to(dtype)


def _gaussian_nll_loss(  # noqa: PLR0913 -- the functional's own signature
    input: Any,  # noqa: A002
    target: Any,
    var: Any,
    full: bool = False,
    eps: float = 1e-6,
    reduction: str = "mean",
) -> Any:
    tensors = all(isinstance(t, torch.Tensor) for t in (input, target, var))
    if not tensors or reduction not in ("none", "mean", "sum"):
        return NotImplemented
    if var.size() != input.size():  # PyTorch's size rules: one dimension short, or one dimension of 1
        if input.size()[:-1] == var.size():
            var = torch.unsqueeze(var, -1)
        elif input.ndim != var.ndim or sum(y for x, y in zip(input.size(), var.size(), strict=True) if x != y) != 1:
            return NotImplemented
    negative = var < 0
    var = var.clamp(min=eps)
    loss = 0.5 * (torch.log(var) + (input - target) ** 2 / var)
    if full:
        loss = loss + 0.5 * math.log(2 * math.pi)
    loss = torch.where(negative, math.nan, loss)
    if reduction == "mean":
        return loss.mean()
    return loss.sum() if reduction == "sum" else loss


def _unchanged_to(tensor: Any, *args: Any, **kwargs: Any) -> Any:
    """``tensor`` when ``tensor.to(*args, **kwargs)`` would return it unchanged (eagerly: the same object)."""
    if not isinstance(tensor, torch.Tensor) or kwargs.get("copy") or any(isinstance(a, torch.Tensor) for a in args):
        return NotImplemented
    options = {k: v for k, v in kwargs.items() if k not in ("copy", "non_blocking")}
    try:
        device, dtype, _non_blocking, memory_format = torch._C._nn._parse_to(*args, **options)
    except (TypeError, RuntimeError):  # arguments PyTorch rejects: let it say so
        return NotImplemented
    if memory_format not in (None, torch.preserve_format) or (dtype is not None and dtype != tensor.dtype):
        return NotImplemented
    if device is not None and torch.device(device) != tensor.device:
        return NotImplemented
    return tensor


def _contiguous_group_norm(x: Any, *args: Any, **kwargs: Any) -> Any:
    """``group_norm`` of ``x`` made contiguous when it is not (module doc)."""
    if not isinstance(x, torch.Tensor) or x.is_contiguous():
        return NotImplemented
    return torch.nn.functional.group_norm(x.contiguous(), *args, **kwargs)


def _view_of_plain_strides(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` (``view``, ``reshape``) of ``tensor`` taken of a contiguous copy when its strides hold a ``Min`` and
    the shapes' ranges prove it contiguous (module doc)."""

    def view(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(tensor, torch.Tensor) or not _merged_strides(tensor):
            return NotImplemented
        return method(tensor.clone(memory_format=torch.contiguous_format), *args, **kwargs)

    view.__name__ = f"{getattr(method, '__name__', 'view')}_of_plain_strides"
    return view


def _merged_strides(tensor: torch.Tensor) -> bool:
    """Whether ``tensor``'s strides are symbolic with a ``Min`` in them (a merged dimension's) while every stride is
    provably the contiguous one (no guard is added: ``statically_known_true``)."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true
    from torch.utils._sympy.functions import Min

    strides = tensor.stride()
    if not any(isinstance(s, torch.SymInt) and s.node.expr.has(Min) for s in strides):
        return False
    expected: Any = 1
    for size, stride in reversed(tuple(zip(tensor.shape, strides, strict=True))):
        if statically_known_true(size == 1):
            continue
        if not statically_known_true(stride == expected):
            return False
        expected = expected * size
    return True


def _data_as_detach(tensor: Any) -> Any:
    """``tensor.data`` as ``tensor.detach()``: one memory, no autograd history (module doc)."""
    return tensor.detach() if isinstance(tensor, torch.Tensor) else NotImplemented


#: ``view`` and ``reshape``, taken of a contiguous copy where the strides hold a merged dimension's ``Min``.
_VIEWS: dict[Callable[..., Any], Callable[..., Any]] = {
    method: _view_of_plain_strides(method) for method in (torch.Tensor.view, torch.Tensor.reshape, torch.reshape)
}

_REPLACEMENTS: dict[Callable[..., Any], Callable[..., Any]] = {
    torch.Tensor.data.__get__: _data_as_detach,  # type: ignore[attr-defined]
    torch.nn.functional.group_norm: _contiguous_group_norm,
    torch.Tensor.to: _unchanged_to,
    **_VIEWS,
    torch.cov: _cov,
    torch.Tensor.cov: _cov,
    torch.corrcoef: _corrcoef,
    torch.Tensor.corrcoef: _corrcoef,
    torch.combinations: _combinations,
    torch.stft: _stft,
    torch.nn.functional.gaussian_nll_loss: _gaussian_nll_loss,
    torch.Tensor.stft: _stft,
}


#: Replacements met in every layer of a model: not worth a log line each.
_PER_LAYER = frozenset({_unchanged_to, _data_as_detach, _contiguous_group_norm, *_VIEWS.values()})


class _StaticComposites(TorchFunctionMode):
    """Calls of the functions in ``_REPLACEMENTS`` go to their static form when it applies, all else to PyTorch
    (``unchanged_to=False``: ``Tensor.to`` too)."""

    def __init__(self, unchanged_to: bool = True) -> None:
        super().__init__()
        self.skipped = () if unchanged_to else (torch.Tensor.to,)

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        replacement = None if func in self.skipped else _REPLACEMENTS.get(func)
        if replacement is not None:
            result = replacement(*args, **kwargs)
            if result is not NotImplemented:
                if replacement not in _PER_LAYER:
                    logger.debug("%s traced through its static form", getattr(func, "__name__", func))
                return result
        return func(*args, **kwargs)


@contextlib.contextmanager
def static_composites(unchanged_to: bool = True) -> Iterator[None]:
    """Within the block, ``torch.cov``, ``torch.corrcoef`` and ``torch.combinations`` run in their static forms
    (the same values; see the module docstring) wherever those apply; torch.export traces those forms.
    ``unchanged_to=False`` leaves ``Tensor.to`` to PyTorch: a model that assigns the unchanged result back to its
    buffer in ``forward`` (CTRL's ``self.pos_encoding = self.pos_encoding.to(...)``) gets a buffer write torch.export
    cannot place in a module, which its verifier refuses.

    >>> with static_composites():  # doctest: +SKIP
    ...     program = torch.export.export(model, args, strict=False)
    """
    with _StaticComposites(unchanged_to):
        yield
