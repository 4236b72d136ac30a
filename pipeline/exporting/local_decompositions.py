"""The exporter's decompositions done node by node where they change only a few nodes, instead of a retrace.

Before translating a torch.export program, ``torch.onnx.export`` decomposes it (``decompose_with_registry``:
``ExportedProgram.run_decompositions`` with the ONNX-friendly table): AOTAutograd traces the whole graph twice more,
once for its metadata and once to capture it, every node through fake tensors and symbolic shapes. That is half of
the export of a cached Llama step (15 of 29 CPU seconds at 8 layers), yet almost every node comes out as it went
in: an op with an ONNX translation is left out of the table, and the retrace keeps it. What changes is known node
by node:

- an op the table decomposes, or a CompositeImplicitAutograd op the export cannot preserve (it may alias or
  mutate) and so the dispatcher decomposes, changes;
- every other op (an ATen op not in the table, a preservable CompositeImplicitAutograd op not in it, a custom op)
  is kept as it is.

:func:`local_decompositions` patches the exporter's ``decompose_with_registry`` for the duration of the ``with``
block (as :mod:`pipeline.exporting.translation_table` patches its registry): when every node of the program is kept,
or is one of the few changing ops whose decomposition follows from the node's own metadata (below), those nodes are
rewritten in place to exactly what the retrace writes, dead nodes are removed as it removes them, and the program
goes on to the translation. Any other program (a mutation, a higher-order op, another changing op, a case below
that its metadata cannot decide, an output that is a rewritten node) is decomposed as before. The graphs are the
same: ``tests/pipeline/generation/test_step_export.py`` compares both ways' graphs and outputs.

=============================================  ========================================================
``x.to(dtype)``, ``x.to(device, dtype)``       ``aten._to_copy(x, dtype=...[, device=...])``
``a & b``, ``a | b``, ``a ^ b`` (``__and__``)  ``aten.bitwise_and`` / ``bitwise_or`` / ``bitwise_xor``
``dropout(x, p, train=False)``                 ``aten.clone(x)``
``x.contiguous()``                             ``x`` when contiguous, else ``aten.clone(x, memory_format=contiguous)``
``x.reshape(shape)``                           ``aten.view(x, shape)`` when ``x`` is contiguous; a strided ``x``
                                               of static size: ``view(x, inferred)`` when its strides allow,
                                               else ``_unsafe_view(clone(x, contiguous), inferred)``
``x.flatten(start, end)``                      as ``reshape`` to the output's static shape
``torch.diff(x, dim=d[, prepend, append])``    ``cat`` of the parts, then ``sub(slice 1:, slice :-1)`` (one
                                               order, static sizes, not boolean)
``aten._assert_tensor_metadata``               kept (the exporter removes assertions afterwards)
=============================================  ========================================================

On a torch without the pieces this reads (the exporter's ``decompose_with_registry``, export's test for
preservable ops), nothing is patched and every program is decomposed as before.
"""

from __future__ import annotations

import functools
import importlib
import logging
import operator
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from pipeline.exporting.patching import SharedPatch

logger = logging.getLogger(__name__)

_A = torch.ops.aten
#: Python operators on symbolic sizes, and ``getitem`` of multi-output ops: kept by the retrace.
_KEPT_FUNCTIONS = frozenset(f for f in vars(operator).values() if callable(f))


def _contiguous(node: torch.fx.Node) -> bool | None:
    """Whether the node's value is contiguous, asked as the retrace asks it (a symbolic layout is decided by the
    same guard); None when its metadata cannot say."""
    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor):
        return None
    try:
        return bool(value.is_contiguous())
    except Exception:  # noqa: BLE001 -- data-dependent: the retrace decides
        return None


Call = tuple[Any, tuple[Any, ...], dict[str, Any]]


class Step(int):
    """In a rewrite of several calls, an argument that is the node an earlier call of the same rewrite made."""


#: One call, the node the original is replaced by, or several calls whose last replaces the original.
Rewrite = Call | torch.fx.Node | list[Call]


def _static_value(node: Any) -> torch.Tensor | None:
    """The node's fake value when every size of it is a plain number (no symbolic size), else None."""
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    if not isinstance(value, torch.Tensor) or not all(isinstance(size, int) for size in value.shape):
        return None
    return value


def _reshaped(source: Any, shape: Any) -> Rewrite | None:
    """What the retrace writes for a reshape of a strided ``source`` (a contiguous one is viewed at the shape as
    given, in :func:`_rewrite`) or a flatten to ``shape`` (static): a view at the inferred shape when the strides
    allow one, else a contiguous copy viewed at the inferred shape; None when a size is symbolic."""
    value = _static_value(source)
    if value is None or not isinstance(shape, list | tuple) or not all(type(size) is int for size in shape):
        return None
    inferred = list(value.reshape(list(shape)).shape)
    try:
        value.view(inferred)
    except (RuntimeError, ValueError):  # the layout needs a copy
        pass
    else:
        return _A.view.default, (source, inferred), {}  # a strided view takes the inferred shape
    return [
        (_A.clone.default, (source,), {"memory_format": torch.contiguous_format}),
        (_A._unsafe_view.default, (Step(0), inferred), {}),
    ]


def _differences(node: torch.fx.Node) -> Rewrite | None:
    """``aten.diff(x, 1, dim, prepend, append)`` of one order along a static axis: the tensors concatenated when a
    prepend or append is given, then the later slice less the earlier, as the retrace writes it (booleans, orders
    above one and symbolic sizes are retraced)."""
    names = ("self", "n", "dim", "prepend", "append")
    given = {**dict(zip(names, node.args, strict=False)), **node.kwargs}
    source, dim = given["self"], given.get("dim", -1)
    parts = [given.get("prepend"), source, given.get("append")]
    found = [_static_value(part) for part in parts if part is not None]
    values = [value for value in found if value is not None]
    if given.get("n", 1) != 1 or len(values) < len(found) or not isinstance(dim, int):
        return None
    if values[0].dtype == torch.bool or not -values[0].dim() <= dim < values[0].dim():
        return None
    length = sum(int(value.shape[dim]) for value in values)
    calls: list[Call] = []
    if len(values) > 1:
        calls.append((_A.cat.default, ([part for part in parts if part is not None], dim), {}))
    whole = Step(0) if calls else source
    first = len(calls)
    calls += [(_A.slice.Tensor, (whole, dim, 0, length - 1), {}), (_A.slice.Tensor, (whole, dim, 1, length), {})]
    return [*calls, (_A.sub.Tensor, (Step(first + 1), Step(first)), {})]


def _rewrite(node: torch.fx.Node) -> Rewrite | None:
    """What the retrace writes for ``node`` (a target, args and kwargs, or the node it is replaced by), or None
    when the node is not one of the table's ops or its case is not decided by its metadata."""
    target, args, kwargs = node.target, node.args, node.kwargs
    if target is _A.to.dtype and len(args) == 2 and not kwargs:
        return _A._to_copy.default, (args[0],), {"dtype": args[1]}
    if target is _A.to.device and len(args) == 3 and not kwargs:
        return _A._to_copy.default, (args[0],), {"dtype": args[2], "device": args[1]}
    bitwise = {_A.__and__.Tensor: _A.bitwise_and.Tensor, _A.__or__.Tensor: _A.bitwise_or.Tensor}
    bitwise[_A.__xor__.Tensor] = _A.bitwise_xor.Tensor
    if target in bitwise and len(args) == 2 and not kwargs:
        return bitwise[target], args, {}
    if target is _A.dropout.default and len(args) == 3 and args[2] is False and not kwargs:
        return _A.clone.default, (args[0],), {}
    if target is _A.contiguous.default and len(args) == 1 and not kwargs and isinstance(args[0], torch.fx.Node):
        contiguous = _contiguous(args[0])
        if contiguous is None:
            return None
        return args[0] if contiguous else (_A.clone.default, args, {"memory_format": torch.contiguous_format})
    if target is _A.reshape.default and len(args) == 2 and not kwargs and isinstance(args[0], torch.fx.Node):
        if _contiguous(args[0]):
            return _A.view.default, args, {}
        return _reshaped(args[0], args[1])
    if target is _A.flatten.using_ints and not kwargs and isinstance(args[0], torch.fx.Node):
        value = _static_value(node)
        return None if value is None else _reshaped(args[0], list(value.shape))
    if target is _A.diff.default and isinstance(args[0], torch.fx.Node):
        return _differences(node)
    return None


def _kept(target: Any, table: dict[Any, Any], preservable: Callable[[Any], bool], cia: Callable[[Any], bool]) -> bool:
    """Whether the retrace keeps a node of ``target`` as it is."""
    if target is _A._assert_tensor_metadata.default:
        return True
    if not isinstance(target, torch._ops.OpOverload):
        return target in _KEPT_FUNCTIONS
    if target._schema.is_mutable or target in table:
        return False
    return preservable(target) or not cia(target)


def decompose_locally(program: torch.export.ExportedProgram, table: dict[Any, Any]) -> bool:
    """Rewrite ``program`` in place as ``run_decompositions(table)`` would write it, when every node is kept or is
    one of the module's table (see the module docstring); False, with the program untouched, otherwise."""
    utils = importlib.import_module("torch._export.utils")
    preservable, cia = utils._is_preservable_cia_op, utils._is_cia_op
    signature = program.graph_signature
    if signature.buffers_to_mutate or signature.user_inputs_to_mutate:
        return _retrace("mutated inputs or buffers")
    graph = program.graph_module.graph
    output = next(n for n in graph.nodes if n.op == "output")
    if not _signature_matches(program, output):  # a rewrite before (program_fixes) left it to the retrace
        return _retrace("the graph signature names other nodes than the graph's")
    changing = []
    for node in graph.nodes:
        if node.op in ("placeholder", "output", "get_attr"):
            continue
        if node.op != "call_function":
            return _retrace(f"a {node.op} node")
        if _kept(node.target, table, preservable, cia):
            continue
        if _rewrite(node) is None or output in node.users:
            return _retrace(f"{node.target} ({node.name})")
        changing.append(node)
    for node in changing:  # in graph order, each read again: its arguments may be nodes rewritten before it
        rewrite = _rewrite(node)
        assert rewrite is not None
        if isinstance(rewrite, torch.fx.Node):
            node.replace_all_uses_with(rewrite)
        else:
            node.replace_all_uses_with(_insert(graph, node, rewrite if isinstance(rewrite, list) else [rewrite]))
        graph.erase_node(node)
    graph.eliminate_dead_code()
    program.graph_module.recompile()
    return True


def _insert(graph: torch.fx.Graph, node: torch.fx.Node, calls: list[Call]) -> torch.fx.Node:
    """The calls inserted before ``node``, each with the node's metadata and its own value (the last: the node's)."""
    made: list[torch.fx.Node] = []

    def resolved(value: Any, fake: bool) -> Any:
        if isinstance(value, list | tuple):
            return type(value)(resolved(item, fake) for item in value)
        if isinstance(value, Step):
            value = made[value]
        return value.meta["val"] if fake and isinstance(value, torch.fx.Node) else value

    for index, (target, args, kwargs) in enumerate(calls):
        with graph.inserting_before(node):
            new = graph.call_function(target, resolved(args, False), kwargs)
        new.meta = dict(node.meta)
        if index < len(calls) - 1:  # an intermediate's value, from the fake values of its arguments
            new.meta.pop("tensor_meta", None)
            new.meta["val"] = target(*resolved(args, True), **kwargs)
        made.append(new)
    return made[-1]


def _signature_matches(program: torch.export.ExportedProgram, output: torch.fx.Node) -> bool:
    """Whether the program's signature names exactly the graph's placeholders and outputs (the retrace writes the
    signature anew; the translation reads it)."""
    from torch.export.graph_signature import ConstantArgument

    graph = program.graph_module.graph
    placeholders = [n.name for n in graph.nodes if n.op == "placeholder"]
    if [getattr(spec.arg, "name", None) for spec in program.graph_signature.input_specs] != placeholders:
        return False
    results = output.args[0] if output.args and isinstance(output.args[0], list | tuple) else ()
    specs = program.graph_signature.output_specs
    if len(results) != len(specs):
        return False
    for spec, result in zip(specs, results, strict=True):
        if isinstance(spec.arg, ConstantArgument):
            if isinstance(result, torch.fx.Node):
                return False
        elif not isinstance(result, torch.fx.Node) or result.name != getattr(spec.arg, "name", None):
            return False
    return True


def _retrace(reason: str) -> bool:
    logger.debug("the exporter's decompositions retrace the program: %s", reason)
    return False


@contextmanager
def local_decompositions() -> Iterator[None]:
    """Within the block, the exporter decomposes a program node by node where that is exact (module doc)."""
    patch = _patch()
    if patch is None:
        yield
        return
    with patch.held():
        yield


@functools.cache
def _patch() -> SharedPatch | None:
    try:
        passes = importlib.import_module("torch.onnx._internal.exporter._fx_passes")
        decomp = importlib.import_module("torch.onnx._internal.exporter._decomp")
        utils = importlib.import_module("torch._export.utils")
    except ImportError:
        return None
    needed = (
        callable(getattr(passes, "decompose_with_registry", None))
        and callable(getattr(decomp, "get_onnx_implemented_overloads", None))
        and callable(getattr(decomp, "create_onnx_friendly_decomposition_table", None))
        and callable(getattr(utils, "_is_preservable_cia_op", None))
        and callable(getattr(utils, "_is_cia_op", None))
    )
    if not needed:
        return None

    @functools.lru_cache(maxsize=8)
    def table(registered: frozenset[Any], _operators: tuple[int, int]) -> dict[Any, Any]:
        return decomp.create_onnx_friendly_decomposition_table(set(registered))

    def wrap(original: Any) -> Any:
        def decompose_with_registry(program: Any, registry: Any) -> Any:
            registered = frozenset(decomp.get_onnx_implemented_overloads(registry))
            # The table costs a quarter of a small model's conversion (it collects every CompositeImplicitAutograd
            # op of every namespace); it changes only with the registry or when an operator or a composite kernel
            # is defined.
            composites = torch._C._dispatch_get_registrations_for_dispatch_key("CompositeImplicitAutograd")
            operators = (len(torch._C._dispatch_get_all_op_names()), len(composites))
            if decompose_locally(program, dict(table(registered, operators))):
                logger.debug("decompositions done node by node, without a retrace")
                return program
            return original(program, registry)

        return decompose_with_registry

    return SharedPatch(passes, "decompose_with_registry", wrap)
