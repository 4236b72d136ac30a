"""torch.export of a model under the stage's patches (:mod:`pipeline.exporting.patch_stack`), traced again where
the failure has a known fix: dynamic dimensions made multiples, branches on tensor data taken as the sample takes them,
the sample's real values deciding data-dependent sizes, ``Tensor.to`` left to PyTorch."""

from __future__ import annotations

from typing import Any

import torch
import torch.utils._pytree as pytree

from pipeline.exporting import errors as export_errors
from pipeline.exporting.multiples import multiples_from, torch_dims, warn_multiples
from pipeline.exporting.patch_stack import tracing_patches
from pipeline.exporting.traced_branches import Branches, branches_on_data, decided_sizes, recorded_branches
from pipeline.settings import DynamicDim


def traced_program(
    model: torch.nn.Module,
    signature: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    names: list[str],
    dynamic: tuple[DynamicDim, ...],
) -> tuple[Any, tuple[DynamicDim, ...], Branches | None]:
    """torch.export's program, traced again when it fails where the fix is known: with the dynamic dimensions made
    multiples of a number the model needs (:mod:`pipeline.exporting.multiples`), with the sample's branches on
    tensor data (:mod:`pipeline.exporting.traced_branches`), then with the sample's real values deciding the guards
    on data-dependent sizes, or several; each at most once. A verifier refusal of a node outside any module (a buffer
    assigned its unchanged ``.to`` in forward) is traced again with ``Tensor.to`` left to PyTorch."""
    branches: Branches | None = None
    multiplied = False
    unchanged_to = True
    real_values: BaseException | None = None  # the error that made the sample's real values decide sizes
    while True:
        try:
            program = _export_program(
                model, signature, args, kwargs, names, dynamic, branches, unchanged_to, real_values is not None
            )
        except Exception as exc:
            multiples = None if multiplied else multiples_from(exc, dynamic)
            if unchanged_to and "missing nn_module_stack" in str(exc):  # a buffer written back in forward
                unchanged_to = False
            elif multiples is not None:
                warn_multiples(dynamic, multiples)
                dynamic, multiplied = multiples, True
            elif branches is None and branches_on_data(exc):
                try:
                    branches = recorded_branches(model, args, kwargs)
                except Exception:  # noqa: BLE001 -- the model ran eagerly before: the export's error is the one to show
                    raise export_errors.torch_export_error(exc) from exc
            elif branches is not None and real_values is None and branches_on_data(exc):
                real_values = exc  # a guard on a size computed from data: decided by the sample's values
            else:
                padded = export_errors.padded_mask_failure(model, args, kwargs) if _broadcast(exc) else None
                raise export_errors.torch_export_error(exc, padded) from exc
            continue
        if real_values is not None and branches is not None and decided_sizes(branches):
            raise export_errors.torch_export_error(real_values) from real_values  # a decision on values: not ours
        return program, dynamic, branches


def _broadcast(exc: BaseException) -> bool:
    """Shapes that did not broadcast under torch.export (the model ran eagerly just before)."""
    return "Attempting to broadcast a dimension" in export_errors.reason(exc)


def _export_program(
    model: torch.nn.Module,
    signature: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    names: list[str],
    dynamic: tuple[DynamicDim, ...],
    branches: Branches | None = None,
    unchanged_to: bool = True,
    real_values: bool = False,
) -> Any:
    dynamic_shapes = _torch_dynamic_shapes(signature, args, kwargs, names, dynamic)
    with tracing_patches(model, branches, unchanged_to=unchanged_to, real_values=real_values):
        return torch.export.export(model, args, kwargs, dynamic_shapes=dynamic_shapes, strict=False)


def _torch_dynamic_shapes(
    signature: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    names: list[str],
    dims: tuple[DynamicDim, ...],
) -> dict[str, Any] | None:
    if not dims:
        return None
    by_name = torch_dims(dims)
    by_input: dict[str, dict[int, Any]] = {}
    for d in dims:
        by_input.setdefault(d.input, {})[d.axis] = by_name[d.name]
    leaf_names = iter(names)

    def spec_for(leaf: Any) -> Any:
        return by_input.get(next(leaf_names)) if isinstance(leaf, torch.Tensor) else None

    shaped_args, shaped_kwargs = pytree.tree_map(spec_for, (args, kwargs))
    bound = signature.bind(*shaped_args, **shaped_kwargs)
    return dict(bound.arguments)
