"""Small modules for ``@converter_case`` declarations of the ATen converters: a function of one, two or three
tensors, with an optional ``prepare`` that turns random inputs into valid ones (a positive-definite or a
triangular matrix, ...). Namedtuple results are returned as plain tuples."""

from __future__ import annotations

from typing import Any

import torch


class Unary(torch.nn.Module):
    """``function(*prepare(a))`` as a module (``prepare`` returns a tuple of arguments)."""

    def __init__(self, function: Any, prepare: Any = None) -> None:
        super().__init__()
        self.function = function
        self.prepare = prepare

    def forward(self, a: torch.Tensor) -> Any:
        """The function of the (prepared) input."""
        inputs = (a,) if self.prepare is None else self.prepare(a)
        return plain(self.function(*inputs))


class Binary(Unary):
    """``function(*prepare(a, b))`` as a module."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> Any:  # type: ignore[override]
        """The function of the (prepared) inputs."""
        inputs = (a, b) if self.prepare is None else self.prepare(a, b)
        return plain(self.function(*inputs))


class Ternary(Unary):
    """``function(*prepare(a, b, c))`` as a module."""

    def forward(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> Any:  # type: ignore[override]
        """The function of the (prepared) inputs."""
        inputs = (a, b, c) if self.prepare is None else self.prepare(a, b, c)
        return plain(self.function(*inputs))


def plain(result: Any) -> Any:
    """A namedtuple result as a plain tuple; anything else unchanged."""
    return tuple(result) if isinstance(result, tuple) else result


def spd(a: torch.Tensor, *rest: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``a`` made symmetric positive definite (``a a^T + n I``); the other arguments unchanged."""
    n = a.shape[-1]
    return (a @ a.mT + n * torch.eye(n), *rest)


def tri(a: torch.Tensor, *rest: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``a``'s lower triangle with a diagonal kept away from zero; the other arguments unchanged."""
    return (a.tril() + 3 * torch.eye(a.shape[-1]), *rest)


def tri_second(b: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(b, tri(a))``."""
    return b, tri(a)[0]


def regular(a: torch.Tensor, *rest: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``a`` plus ``3 I`` (well away from singular for standard-normal entries); the other arguments unchanged."""
    return (a + 3 * torch.eye(a.shape[-2], a.shape[-1]), *rest)
