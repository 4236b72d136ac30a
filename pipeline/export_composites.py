"""Composite PyTorch functions traced, during torch.export, through an equivalent Python form the graph can hold.

Some composite ops are written (in C++) with a branch on a tensor's value, or produce a data-dependent size on the
way to a static one; torch.export then fails or keeps an op no ONNX translation has. Where the branch or the size
is known from the static shapes and arguments alone, the same computation written without it is exact:

- ``torch.cov`` without weights: the degrees of freedom are ``n - correction`` (a number, not a tensor, so no
  ``aten.equal`` on ``norm_factor <= 0``); the same ops in the same order as PyTorch's ``cov``.
- ``torch.corrcoef``: PyTorch's ``corrcoef`` on that ``cov``.
- ``torch.combinations`` of a 1-d tensor of static length: the ``C(n, r)`` index tuples are a constant table,
  and the result a gather with it (PyTorch's goes through ``masked_select``, which has no static output size).

Anything else (weights, empty results) is left to PyTorch, and fails or exports as before.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

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


_REPLACEMENTS: dict[Callable[..., Any], Callable[..., Any]] = {
    torch.cov: _cov,
    torch.Tensor.cov: _cov,
    torch.corrcoef: _corrcoef,
    torch.Tensor.corrcoef: _corrcoef,
    torch.combinations: _combinations,
}


class _StaticComposites(TorchFunctionMode):
    """Calls of the functions in ``_REPLACEMENTS`` go to their static form when it applies, all else to PyTorch."""

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        replacement = _REPLACEMENTS.get(func)
        if replacement is not None:
            result = replacement(*args, **kwargs)
            if result is not NotImplemented:
                logger.debug("%s traced through its static form", getattr(func, "__name__", func))
                return result
        return func(*args, **kwargs)


@contextlib.contextmanager
def static_composites() -> Iterator[None]:
    """Within the block, ``torch.cov``, ``torch.corrcoef`` and ``torch.combinations`` run in their static forms
    (the same values; see the module docstring) wherever those apply; torch.export traces those forms.

    >>> with static_composites():  # doctest: +SKIP
    ...     program = torch.export.export(model, args, strict=False)
    """
    with _StaticComposites():
        yield
