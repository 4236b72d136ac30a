"""How a model's forward hands its features method the sample's inputs and where it places the features, as
:mod:`pipeline.generation.placement_check` found on the sample: the registries it fills and what reads them (the
features method called as the forward calls it, :func:`handed_as_in_forward`; the module whose handed embeddings the
step places the features in, :func:`placed_at`). Kept apart from the check so that the modules the check imports can
read them."""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable
from typing import Any

import torch

#: How a forward may hand the features method one of the sample's inputs, by name: the inverse of a mask (``~mask``).
HANDED_AS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"bitwise_not": torch.bitwise_not}

#: What each model's forward hands its features method changed (the check): input name -> HANDED_AS key.
HANDED: weakref.WeakKeyDictionary[Any, tuple[tuple[str, str], ...]] = weakref.WeakKeyDictionary()
#: The module each model's forward hands the embeddings it places the features in (the check).
HANDED_TO: weakref.WeakKeyDictionary[Any, torch.nn.Module] = weakref.WeakKeyDictionary()
#: That module, for the models whose step places the features there (``embeddings_receiver``).
PLACED_AT: weakref.WeakKeyDictionary[Any, torch.nn.Module] = weakref.WeakKeyDictionary()


def placed_at(model: Any) -> torch.nn.Module | None:
    """The module in whose handed embeddings the step places ``model``'s features (``embeddings_receiver``), None
    where it places them in its input embedding's output."""
    try:
        return PLACED_AT.get(model)
    except TypeError:
        return None


class HandedFeatures:
    """A features ``method`` that hands its inputs named in ``handed`` (name, :data:`HANDED_AS` key) changed, as the
    model's forward hands them; called, and signed, as the method is."""

    def __init__(self, method: Any, handed: tuple[tuple[str, str], ...]) -> None:
        self.method = method
        self.handed = handed
        self.__name__ = getattr(method, "__name__", type(self).__name__)
        self.__signature__ = inspect.signature(method)

    def __call__(self, *args: Any, **inputs: Any) -> Any:
        """The method's output on ``args``/``inputs``, those in :attr:`handed` changed as the forward changes them."""
        bound = self.__signature__.bind_partial(*args, **inputs)
        given = dict(bound.arguments)
        for name, how in self.handed:
            if isinstance(given.get(name), torch.Tensor):
                given[name] = HANDED_AS[how](given[name])
        rest = given.pop(
            next((p.name for p in self.__signature__.parameters.values() if p.kind is p.VAR_KEYWORD), ""), {}
        )
        return self.method(**given, **rest)


def handed_as_in_forward(model: Any, method: Any) -> Any:
    """``method`` as the model's forward calls it (:class:`HandedFeatures`) where the check saw the
    forward change some of its inputs, else ``method`` as it is."""
    try:
        handed = HANDED.get(model)
    except TypeError:  # not weakly referenceable: never seen
        return method
    return HandedFeatures(method, handed) if handed and method is not None else method
