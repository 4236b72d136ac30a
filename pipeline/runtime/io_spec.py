"""How a model's Python call maps onto the flat inputs and outputs of a graph, and back.

The sample's ``(args, kwargs)`` is bound to the model's ``forward`` signature (so ``m(x, y=t)`` and ``m(x, t)``
mean the same), flattened with torch's pytree, and every tensor leaf becomes one graph input named after its
path (``input_ids``, ``pair_0``, ``batch_pixels``). Non-tensor leaves (``None``, flags, numbers) are constants
of the export: a later call must pass the same values. Outputs are flattened the same way; ``None`` leaves are
kept as constants, every tensor leaf is one graph output named after its path (``logits``, ``out_1``).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree

from converters.errors import ArtifactError, ExportError, InputError
from pipeline.runtime import containers

TENSOR = "tensor"
CONSTANT = "constant"


@dataclass(frozen=True)
class TensorSpec:
    """One graph input or output: name, torch dtype name (``float32``) and shape (``str`` for symbolic dims)."""

    name: str
    dtype: str
    shape: tuple[int | str, ...]

    @property
    def torch_dtype(self) -> torch.dtype:
        """The tensor's dtype as a torch dtype."""
        dtype: torch.dtype = getattr(torch, self.dtype)
        return dtype


@dataclass(frozen=True)
class Leaf:
    """One pytree leaf of the call or of the result: a tensor (index into inputs/outputs) or a constant."""

    kind: str
    index: int = -1
    value: Any = None


@dataclass(frozen=True)
class IOSpec:
    """Everything needed to call a graph like the original model, saved with every artifact."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    input_tree: str
    input_leaves: tuple[Leaf, ...]
    output_tree: str
    output_leaves: tuple[Leaf, ...]
    signature: tuple[tuple[str, int, bool, Any], ...]

    def to_json(self) -> dict[str, Any]:
        """The spec as JSON-ready data (saved in artifacts)."""
        return {
            "inputs": [[t.name, t.dtype, list(t.shape)] for t in self.inputs],
            "outputs": [[t.name, t.dtype, list(t.shape)] for t in self.outputs],
            "input_tree": self.input_tree,
            "input_leaves": [[leaf.kind, leaf.index, leaf.value] for leaf in self.input_leaves],
            "output_tree": self.output_tree,
            "output_leaves": [[leaf.kind, leaf.index, leaf.value] for leaf in self.output_leaves],
            "signature": [list(p) for p in self.signature],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> IOSpec:
        """A spec from :meth:`to_json` data."""
        return cls(
            inputs=tuple(TensorSpec(n, d, tuple(s)) for n, d, s in data["inputs"]),
            outputs=tuple(TensorSpec(n, d, tuple(s)) for n, d, s in data["outputs"]),
            input_tree=data["input_tree"],
            input_leaves=tuple(Leaf(k, i, v) for k, i, v in data["input_leaves"]),
            output_tree=data["output_tree"],
            output_leaves=tuple(Leaf(k, i, v) for k, i, v in data["output_leaves"]),
            signature=tuple((str(n), int(k), bool(h), v) for n, k, h, v in data["signature"]),
        )

    # -- calls ------------------------------------------------------------------------------------------------

    def flatten_call(self, args: Sequence[Any], kwargs: dict[str, Any]) -> list[torch.Tensor]:
        """The graph inputs for one call of the converted module, in graph order; a mismatch is an InputError."""
        try:
            given = self._signature.bind_partial(*args, **kwargs).arguments
        except TypeError:
            given = None  # bind_call below says why
        missing = [
            p.name
            for p in self._signature.parameters.values()
            if given is not None and p.default is _NO_DEFAULT and p.name not in given
        ]
        if missing:
            raise InputError(
                f"the call is missing the required argument(s) {', '.join(map(repr, missing))} of "
                f"forward({_param_list(self._signature)})",
                fix="pass every argument the sample had",
            )
        args, kwargs = bind_call(self._signature, args, kwargs)
        leaves, tree = pytree.tree_flatten((tuple(args), kwargs))
        if tree != self._input_treespec:
            raise InputError(
                f"the call's structure {describe_tree(tree)} differs from the sample's "
                f"{describe_tree(self._input_treespec)}",
                fix="call the converted module with the same arguments (same nesting, same keyword names) as the "
                "sample it was converted with",
            )
        tensors: list[torch.Tensor] = [torch.empty(0)] * len(self.inputs)
        for position, (leaf, slot) in enumerate(zip(leaves, self.input_leaves, strict=True)):
            if slot.kind == TENSOR:
                if not isinstance(leaf, torch.Tensor):
                    raise InputError(
                        f"argument {self.inputs[slot.index].name!r} must be a tensor (it was one in the sample), "
                        f"got {type(leaf).__name__}",
                        fix="pass a tensor there",
                    )
                tensors[slot.index] = leaf
            elif _jsonable(leaf) != slot.value:
                raise InputError(
                    f"non-tensor argument #{position} (in flattened order) is {leaf!r}, but the model was exported "
                    f"with {slot.value!r} and the graph has that value built in",
                    fix=f"pass {slot.value!r}, or convert again with a sample that uses {leaf!r}",
                )
        return tensors

    def unflatten_outputs(self, tensors: Sequence[torch.Tensor]) -> Any:
        """The model's result structure (tensor, tuple, dict, ModelOutput, ...) rebuilt from graph outputs."""
        leaves = [tensors[leaf.index] if leaf.kind == TENSOR else leaf.value for leaf in self.output_leaves]
        return pytree.tree_unflatten(leaves, self._output_treespec)

    def feed_to_call(self, feed: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Rebuild ``(args, kwargs)`` for the original model from a ``{input name: tensor}`` feed."""
        leaves = [
            feed[self.inputs[slot.index].name] if slot.kind == TENSOR else slot.value for slot in self.input_leaves
        ]
        args, kwargs = pytree.tree_unflatten(leaves, self._input_treespec)
        return tuple(args), dict(kwargs)

    # Parsed once per spec: the runtime module calls flatten_call/unflatten_outputs on every forward.
    @functools.cached_property
    def _signature(self) -> inspect.Signature:
        return _signature_from(self.signature)

    @functools.cached_property
    def _input_treespec(self) -> pytree.TreeSpec:
        return load_tree(self.input_tree)

    @functools.cached_property
    def _output_treespec(self) -> pytree.TreeSpec:
        return load_tree(self.output_tree)


# -- building the spec at export time ------------------------------------------------------------------------------


def normalise_sample(sample: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A tensor, a tuple/list of arguments, or ``(args, kwargs)`` -> ``(args, kwargs)``."""
    if isinstance(sample, torch.Tensor):
        return (sample,), {}
    if isinstance(sample, tuple | list):
        if len(sample) == 2 and isinstance(sample[1], dict) and isinstance(sample[0], tuple | list):
            return tuple(sample[0]), dict(sample[1])
        return tuple(sample), {}
    if isinstance(sample, dict):
        return (), dict(sample)
    raise InputError(
        f"cannot read a sample of type {type(sample).__name__}",
        fix="pass a tensor, a tuple of arguments, or (args, kwargs), e.g. sample=((x,), {'mask': m})",
    )


def forward_signature(model: torch.nn.Module) -> inspect.Signature:
    """The signature of ``model.forward`` (what samples and calls are bound to)."""
    return inspect.signature(model.forward)


def bind_call(
    signature: inspect.Signature, args: Sequence[Any], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Canonical ``(args, kwargs)``: every parameter that can be a keyword is one, in signature order.

    Omitted parameters whose default is a plain value (None, bool, number, str) are filled in, so a call that
    spells out a default (``return_dict=None``) is the same call as one that leaves it out. Keywords rather than
    positions also keep clear of wrappers (transformers' among them) that inject keyword arguments.
    """
    unknown = unknown_keywords(signature, kwargs)
    if unknown:
        raise InputError(
            f"forward({_param_list(signature)}) has no argument {', '.join(map(repr, unknown))}; its arguments are: "
            f"{keyword_names(signature)}",
            fix="name the arguments as forward() does (sample=((args...), {kwargs...}))",
        )
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise InputError(
            f"the arguments do not fit forward({_param_list(signature)}): {exc}",
            fix="pass the arguments forward() takes (sample=((args...), {kwargs...}))",
        ) from None
    params = list(signature.parameters.values())
    # With values in *args, the parameters before it can only be passed by position.
    by_position = any(p.kind == p.VAR_POSITIONAL and bound.arguments.get(p.name) for p in params)
    out_args: list[Any] = []
    out_kwargs: dict[str, Any] = {}
    for p in params:
        if p.name in bound.arguments:
            value = bound.arguments[p.name]
        elif _fillable_default(p):
            value = p.default
        else:
            continue
        if p.kind == p.POSITIONAL_ONLY or (p.kind == p.POSITIONAL_OR_KEYWORD and by_position):
            out_args.append(value)
        elif p.kind == p.VAR_POSITIONAL:
            out_args.extend(value)
        elif p.kind == p.VAR_KEYWORD:
            out_kwargs.update(value)
        else:
            out_kwargs[p.name] = value
    return tuple(out_args), out_kwargs


def unknown_keywords(signature: inspect.Signature, kwargs: Iterable[str]) -> list[str]:
    """The keyword names ``forward`` cannot take (none when it has ``**kwargs``); checked before binding, so an
    argument under a wrong name is named as such rather than reported as the one it leaves missing."""
    params = signature.parameters.values()
    if any(p.kind == p.VAR_KEYWORD for p in params):
        return []
    takes = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return [name for name in kwargs if name not in takes]


def keyword_names(signature: inspect.Signature) -> str:
    """The arguments of ``forward`` that can be passed by name, for messages (``x, mask``)."""
    params = signature.parameters.values()
    return ", ".join(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)) or "(none)"


def input_names_and_leaves(
    signature: inspect.Signature, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[list[str], list[torch.Tensor], tuple[Leaf, ...], str]:
    """Names and tensors of the graph inputs, the leaf slots, and the serialised tree of the call."""
    leaves_with_paths, tree = containers.flatten_with_paths((args, kwargs))
    param_names = [p.name for p in signature.parameters.values()]
    positional = _positional_names(signature, len(args))
    names: list[str] = []
    tensors: list[torch.Tensor] = []
    slots: list[Leaf] = []
    for path, leaf in leaves_with_paths:
        if isinstance(leaf, torch.Tensor):
            slots.append(Leaf(TENSOR, len(tensors)))
            names.append(_input_name(path, positional, param_names))
            tensors.append(leaf)
        else:
            value = _jsonable(leaf)
            if value is _UNSERIALISABLE:
                raise InputError(
                    f"sample argument {pytree.keystr(path)} is a {type(leaf).__name__}, which can be neither a "
                    "graph input nor a saved constant",
                    fix="pass tensors, or None/bool/int/float/str values, in the sample",
                )
            slots.append(Leaf(CONSTANT, value=value))
    return names, tensors, tuple(slots), dump_tree(tree)


def output_names_and_leaves(
    result: Any, constants: bool = False
) -> tuple[list[str], list[torch.Tensor], tuple[Leaf, ...], str]:
    """The tensor outputs of a model's result: names from their pytree paths, tensors, leaves and the tree.
    ``constants``: a Python number, bool or string in the result is kept as a constant leaf (the module returns that
    value), else it is an ExportError.

    Dataclasses nobody registered with torch's pytree are registered first (:func:`containers.register_dataclasses`),
    so that they come back as their own type; any other unknown container is an ExportError that names it.
    """
    containers.register_dataclasses(result)
    leaves_with_paths, tree = containers.flatten_with_paths(result)
    names: list[str] = []
    tensors: list[torch.Tensor] = []
    slots: list[Leaf] = []
    for path, leaf in leaves_with_paths:
        if isinstance(leaf, torch.Tensor):
            slots.append(Leaf(TENSOR, len(tensors)))
            names.append(_output_name(path))
            tensors.append(leaf)
        elif leaf is None or is_model_cache(leaf):  # a transformers cache object: not a graph output (None)
            slots.append(Leaf(CONSTANT, value=None))
        elif constants and isinstance(leaf, bool | int | float | str):  # a number of the call's shapes
            slots.append(Leaf(CONSTANT, value=leaf))
        else:
            raise containers.unknown_container_error(path, leaf)
    if not tensors:
        raise ExportError("the model returns no tensor", fix="return at least one tensor from forward()")
    return names, tensors, tuple(slots), dump_tree(tree)


def distinct_output_names(out_names: list[str], in_names: list[str]) -> list[str]:
    """Output names that no input (and no other output) has: a diffusers UNet takes ``sample`` and returns
    ``sample``, which becomes the output ``sample_out``.

    >>> distinct_output_names(["sample", "sample"], ["sample", "timestep"])
    ['sample_out', 'sample_out_1']
    """
    taken = set(in_names)
    names: list[str] = []
    for name in out_names:
        unique = name if name not in taken else f"{name}_out"
        suffix = 0
        while unique in taken:
            suffix += 1
            unique = f"{name}_out_{suffix}"
        taken.add(unique)
        names.append(unique)
    return names


def is_model_cache(value: Any) -> bool:
    """Whether ``value`` is a transformers ``Cache`` (``DynamicCache``, ...): a model's key/value cache, which the
    plain forward's graph does not return (the module returns None in its place; ``generation=`` converts the
    cached step instead). Recognised by type name, without importing transformers."""
    return any(c.__name__ == "Cache" and c.__module__.startswith("transformers.") for c in type(value).__mro__)


def dump_tree(tree: pytree.TreeSpec) -> str:
    """A pytree spec as a JSON string (saved in artifacts)."""
    try:
        return containers.dumps(tree)
    except ExportError:
        raise
    except Exception as exc:  # a container type torch's pytree can flatten but not serialise
        raise ExportError(
            f"cannot record the structure {describe_tree(tree)}: {exc}",
            fix="return tuples, lists, dicts or a pytree-registered type with a serialized_type_name",
        ) from exc


def load_tree(text: str) -> pytree.TreeSpec:
    """Deserialise a tree, importing the module of a registered container type (e.g. transformers outputs)."""
    try:
        return containers.loads(text)
    except ArtifactError:
        raise
    except Exception:
        for type_name in containers.serialised_type_names(text):
            module = type_name.rpartition(".")[0]
            if module and ":" not in type_name:
                __import__(module)
        return containers.loads(text)


def describe_tree(tree: pytree.TreeSpec) -> str:
    """A pytree spec in words, for error messages."""
    return str(tree).replace("\n", "").replace("  ", "")


def signature_record(signature: inspect.Signature) -> tuple[tuple[str, int, bool, Any], ...]:
    """(name, kind, has a fillable default, that default) per parameter: enough to bind calls after loading."""
    return tuple(
        (p.name, int(p.kind), _fillable_default(p), p.default if _fillable_default(p) else None)
        for p in signature.parameters.values()
    )


# -- helpers --------------------------------------------------------------------------------------------------------

_UNSERIALISABLE = object()
_NO_DEFAULT = object()


def _fillable_default(p: inspect.Parameter) -> bool:
    if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.default is p.empty:
        return False
    return _jsonable(p.default) is not _UNSERIALISABLE


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return _UNSERIALISABLE


def _param_list(signature: inspect.Signature) -> str:
    prefixes: dict[inspect._ParameterKind, str] = {
        inspect.Parameter.VAR_POSITIONAL: "*",
        inspect.Parameter.VAR_KEYWORD: "**",
    }
    return ", ".join(prefixes.get(p.kind, "") + p.name for p in signature.parameters.values())


def _signature_from(record: tuple[tuple[str, int, bool, Any], ...]) -> inspect.Signature:
    params = []
    for name, kind_value, has_default, value in record:
        kind = inspect._ParameterKind(kind_value)
        default: Any = value if has_default else _NO_DEFAULT  # the sentinel only keeps parameter order legal
        if kind in (kind.VAR_POSITIONAL, kind.VAR_KEYWORD):
            default = inspect.Parameter.empty
        params.append(inspect.Parameter(name, kind, default=default))
    return inspect.Signature(params)


def _positional_names(signature: inspect.Signature, count: int) -> list[str]:
    names: list[str] = []
    for p in signature.parameters.values():
        if p.kind == p.VAR_POSITIONAL:
            names += [p.name] * (count - len(names))
            break
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            names.append(p.name)
    return names[:count]


def _input_name(path: tuple[Any, ...], positional: list[str], params: list[str]) -> str:
    # path[0] selects args (0) or kwargs (1); the next key is the position or the keyword.
    top, key, rest = path[0], path[1], path[2:]
    if top.idx == 0:
        name = positional[key.idx] if key.idx < len(positional) else f"arg{key.idx}"
        if positional.count(name) > 1:  # *args: the exporter names them rest_0, rest_1
            rest = (pytree.SequenceKey(key.idx - positional.index(name)), *rest)
    else:
        name = str(key.key)
    suffix = _path_name(rest)
    return f"{name}_{suffix}" if suffix else name


def _output_name(path: tuple[Any, ...]) -> str:
    """``out`` for a bare tensor, ``out_1`` for a tuple element, ``logits`` for a dict or ModelOutput key."""
    name = _path_name(path)
    if not name:
        return "out"
    return f"out_{name}" if isinstance(path[0], pytree.SequenceKey) else name


def _path_name(path: tuple[Any, ...]) -> str:
    parts = []
    for key in path:
        if isinstance(key, pytree.SequenceKey):
            parts.append(str(key.idx))
        elif isinstance(key, pytree.MappingKey):
            parts.append(str(key.key))
        elif isinstance(key, pytree.GetAttrKey):
            parts.append(key.name)
        else:
            parts.append(str(key).strip(".[]'\""))
    return "_".join(parts)
