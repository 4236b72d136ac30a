"""``module.to(...)`` inside ``forward()`` that changes nothing, traced as what it is: nothing.

Some models convert a submodule on every call, ``self.classifier = self.classifier.to(self.dtype)`` (transformers'
Switch Transformers router, which keeps its router in float32 whatever the model's dtype). Eagerly, when the
weights already have that dtype and device, ``nn.Module.to`` changes nothing; under torch.export it still walks
the parameters and tries to swap each for itself, which the exporter's tensors refuse ("Cannot swap t1 because it
has weakref associated with it"), so the whole export fails on a call that does nothing.

:func:`unchanged_module_to_is_free` patches ``nn.Module.to`` for the duration of the ``with`` block (as
:mod:`pipeline.exporting.translation_table` patches the exporter's registry): a call whose device and dtype every
parameter and buffer already has returns the module untouched, exactly what the original returns eagerly. A call
that would change a tensor (another dtype, another device, a memory format) goes to the original, and fails under
torch.export as before, with our error saying what to do (:func:`pipeline.exporting.errors.torch_export_error`).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

import torch

from pipeline.exporting.patching import SharedPatch


def _changes_nothing(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """``module.to(*args, **kwargs)`` would leave every parameter and buffer as it is."""
    try:
        device, dtype, _non_blocking, memory_format = torch._C._nn._parse_to(*args, **kwargs)
    except (TypeError, RuntimeError):  # arguments the original will reject with its own message
        return False
    if memory_format is not None:
        return False
    for tensor in (*module.parameters(), *module.buffers()):
        if device is not None and tensor.device != torch.device(device):
            return False
        # like nn.Module.to: dtype applies to floating-point and complex tensors only
        if dtype is not None and (tensor.is_floating_point() or tensor.is_complex()) and tensor.dtype != dtype:
            return False
    return True


def _wrap(original: Any) -> Any:
    def to(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        if _changes_nothing(self, args, kwargs):
            return self
        return original(self, *args, **kwargs)

    return to


_PATCH = SharedPatch(torch.nn.Module, "to", _wrap)


def unchanged_module_to_is_free() -> AbstractContextManager[None]:
    """Within the block, ``nn.Module.to`` returns the module untouched when it would change nothing (module doc)."""
    return _PATCH.held()
