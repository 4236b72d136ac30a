"""Complex arithmetic inside a model written as real arithmetic before the ONNX translation.

Rotary embeddings written with complex numbers (DeepSeek-V2, Llama 4, several audio codecs) build a complex tensor
inside ``forward`` (``torch.polar``, ``torch.view_as_complex``), multiply, and come back to real numbers
(``torch.view_as_real``). ONNX has no complex type: the exporter carries a complex tensor as a real one with a last
axis of two (real, imaginary) and translates an op on it only when onnxscript has a complex form of that op, which
``unsqueeze``, ``expand`` and ``select`` do not ("No decompositions registered for the complex-valued input"), and
TensorRT takes none of that form anyway.

:func:`complex_as_real` rewrites the torch.export program instead: every complex tensor between the model's real
inputs and real outputs becomes its real pair ``[..., 2]``, and each op on it the real ops that compute the same
numbers (a product ``(a + bi)(c + di)`` is ``ac - bd`` and ``ad + bc``; a shape op takes the same arguments with
negative axes counted past the pair's axis). A list of complex tensors (``split``, ``chunk``, ``unbind``) becomes
the list of their pairs, and a stored complex tensor (a buffer of rotary frequencies, as QwenImage's) is read
through ``view_as_real``, which the exporter translates. The rewrite is all or nothing: when one complex op has no
rule here, or a complex tensor is an input or an output of the program, nothing changes (the exporter then fails or
translates as before, and the error names the op).
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable
from typing import Any

import torch

logger = logging.getLogger(__name__)

_A = torch.ops.aten
_REAL_OF = {torch.complex64: torch.float32, torch.complex128: torch.float64, torch.complex32: torch.float16}

Rule = Callable[["_Rewriter", torch.fx.Node], Any]


def _complex(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.is_complex()


def _is_complex_node(value: Any) -> bool:
    return isinstance(value, torch.fx.Node) and _complex(value.meta.get("val"))


def _is_complex_list(value: Any) -> bool:
    """A node whose value is a list of complex tensors (``split``, ``unbind``), read through ``getitem``."""
    if not isinstance(value, torch.fx.Node):
        return False
    meta = value.meta.get("val")
    return isinstance(meta, list | tuple) and bool(meta) and all(_complex(v) for v in meta)


def _axis(axis: int) -> int:
    """A complex tensor's axis on its real pair: a negative axis counts past the pair's last axis."""
    return axis - 1 if axis < 0 else axis


def _args(node: torch.fx.Node) -> list[Any]:
    return list(node.args)


def _kwargs(node: torch.fx.Node) -> dict[str, Any]:
    return dict(node.kwargs)


def _meta(value: Any) -> Any:
    if isinstance(value, torch.fx.Node):
        return value.meta["val"]
    if isinstance(value, list | tuple):
        return type(value)(_meta(v) for v in value)
    return value


class _Rewriter:
    """Writes the real ops before the node being rewritten; ``pairs`` maps each complex node to its real pair."""

    def __init__(self, graph: torch.fx.Graph) -> None:
        self.graph = graph
        self.pairs: dict[torch.fx.Node, torch.fx.Node] = {}
        self.node: torch.fx.Node | None = None
        self.written: list[torch.fx.Node] = []

    def call(self, target: Any, *args: Any, **kwargs: Any) -> torch.fx.Node:
        node = self.graph.call_function(target, args, kwargs)
        self.written.append(node)
        node.meta = {k: v for k, v in (self.node.meta if self.node is not None else {}).items() if k != "val"}
        node.meta["val"] = target(*_meta(args), **{k: _meta(v) for k, v in kwargs.items()})
        return node

    def pair(self, value: Any) -> Any:
        return self.pairs[value] if _is_complex_node(value) or _is_complex_list(value) else value

    def pair_of(self, value: Any) -> torch.fx.Node:
        """The real pair of a complex node."""
        return self.pairs[value]

    def parts(self, value: Any) -> tuple[torch.fx.Node, torch.fx.Node]:
        pair = self.pair_of(value)
        return self.call(_A.select.int, pair, -1, 0), self.call(_A.select.int, pair, -1, 1)

    def joined(self, real: torch.fx.Node, imaginary: torch.fx.Node) -> torch.fx.Node:
        return self.call(_A.stack.default, [real, imaginary], -1)

    def with_pair_axis(self, value: Any) -> torch.fx.Node:
        """A real tensor broadcast against a complex one: an axis of one for the pair's axis."""
        return self.call(_A.unsqueeze.default, value, -1)


def _same_on_pair(axes: tuple[int, ...] = ()) -> Rule:
    """An op that acts on the pair as on the complex tensor, its argument positions ``axes`` being axes."""

    def rule(r: _Rewriter, node: torch.fx.Node) -> Any:
        args = [r.pair(a) for a in _args(node)]
        if node.target in (_A.sum.dim_IntList, _A.mean.dim) and (len(args) < 2 or not args[1]):
            raise _Unsupported("a reduction over every axis of a complex tensor")  # it would sum the pair too
        for i in axes:
            if i < len(args):
                args[i] = [_axis(a) for a in args[i]] if isinstance(args[i], list | tuple) else _axis(args[i])
        kwargs = {k: r.pair(v) for k, v in _kwargs(node).items()}
        if "dim" in kwargs and isinstance(kwargs["dim"], int):
            kwargs["dim"] = _axis(kwargs["dim"])
        return r.call(node.target, *args, **kwargs)

    return rule


def _with_pair_size(r: _Rewriter, node: torch.fx.Node) -> Any:
    """``view``/``reshape``/``expand``: the sizes with the pair's 2 at the end."""
    return r.call(node.target, r.pair(_args(node)[0]), [*_args(node)[1], 2], *_args(node)[2:], **_kwargs(node))


def _permute(r: _Rewriter, node: torch.fx.Node) -> Any:
    rank = node.meta["val"].dim()
    return r.call(node.target, r.pair(_args(node)[0]), [d % rank for d in _args(node)[1]] + [rank])


def _repeat(r: _Rewriter, node: torch.fx.Node) -> Any:
    return r.call(node.target, r.pair(_args(node)[0]), [*_args(node)[1], 1])


def _join_lists(r: _Rewriter, node: torch.fx.Node) -> Any:
    """``cat``/``stack`` of complex tensors (each one's pair) along the axis counted on the pairs."""
    tensors = _args(node)[0]
    if not all(_is_complex_node(t) for t in tensors):
        raise _Unsupported("a complex tensor joined with a real one")
    axis = _args(node)[1] if len(_args(node)) > 1 else _kwargs(node).get("dim", 0)
    return r.call(node.target, [r.pair_of(t) for t in tensors], _axis(axis))


def _pad_sequence(r: _Rewriter, node: torch.fx.Node) -> Any:
    """``pad_sequence`` of complex tensors (their leading axis padded) with zeros: the pairs padded alike."""
    tensors, *rest = _args(node)
    if not all(_is_complex_node(t) for t in tensors):
        raise _Unsupported("a complex tensor padded beside a real one")
    padding = rest[1] if len(rest) > 1 else _kwargs(node).get("padding_value", 0.0)
    if padding != 0:
        raise _Unsupported("complex sequences padded with a value other than zero")
    return r.call(node.target, [r.pair_of(t) for t in tensors], *rest, **_kwargs(node))


def _to_copy(r: _Rewriter, node: torch.fx.Node) -> Any:
    kwargs = dict(_kwargs(node))
    dtype = kwargs.get("dtype")
    if dtype is not None:
        if dtype not in _REAL_OF:
            raise _Unsupported(f"a complex tensor converted to {dtype}")
        kwargs["dtype"] = _REAL_OF[dtype]
    return r.call(node.target, r.pair(_args(node)[0]), **kwargs)


def _view_as_complex(r: _Rewriter, node: torch.fx.Node) -> Any:
    return _args(node)[0]  # its pair is the real tensor itself


def _polar(r: _Rewriter, node: torch.fx.Node) -> Any:
    magnitude, angle = _args(node)[:2]
    return r.joined(
        r.call(_A.mul.Tensor, magnitude, r.call(_A.cos.default, angle)),
        r.call(_A.mul.Tensor, magnitude, r.call(_A.sin.default, angle)),
    )


def _complex_of(r: _Rewriter, node: torch.fx.Node) -> Any:
    return r.joined(_args(node)[0], _args(node)[1])


def _product(r: _Rewriter, node: torch.fx.Node) -> Any:
    left, right = _args(node)[:2]
    if _is_complex_node(left) and _is_complex_node(right):
        (a, b), (c, d) = r.parts(left), r.parts(right)
        real = r.call(_A.sub.Tensor, r.call(_A.mul.Tensor, a, c), r.call(_A.mul.Tensor, b, d))
        imaginary = r.call(_A.add.Tensor, r.call(_A.mul.Tensor, a, d), r.call(_A.mul.Tensor, b, c))
        return r.joined(real, imaginary)
    complex_side, other = (left, right) if _is_complex_node(left) else (right, left)
    if isinstance(other, complex):
        raise _Unsupported("a product with a complex Python number")
    scale = r.with_pair_axis(other) if isinstance(other, torch.fx.Node) else other
    return r.call(_A.mul.Tensor, r.pair_of(complex_side), scale)


def _quotient(r: _Rewriter, node: torch.fx.Node) -> Any:
    numerator, denominator = _args(node)[:2]
    if _is_complex_node(denominator) or isinstance(denominator, complex) or _kwargs(node):
        raise _Unsupported("a division by a complex number or with rounding")
    scale = r.with_pair_axis(denominator) if isinstance(denominator, torch.fx.Node) else denominator
    return r.call(_A.div.Tensor, r.pair_of(numerator), scale)


def _sum_or_difference(r: _Rewriter, node: torch.fx.Node) -> Any:
    left, right = _args(node)[:2]
    if not (_is_complex_node(left) and _is_complex_node(right)):
        raise _Unsupported("a sum or difference of a complex and a real tensor")
    return r.call(node.target, r.pair_of(left), r.pair_of(right), *_args(node)[2:], **_kwargs(node))


def _conjugate(r: _Rewriter, node: torch.fx.Node) -> Any:
    real, imaginary = r.parts(_args(node)[0])
    return r.joined(real, r.call(_A.neg.default, imaginary))


def _exp(r: _Rewriter, node: torch.fx.Node) -> Any:
    real, imaginary = r.parts(_args(node)[0])
    magnitude = r.call(_A.exp.default, real)
    return r.joined(
        r.call(_A.mul.Tensor, magnitude, r.call(_A.cos.default, imaginary)),
        r.call(_A.mul.Tensor, magnitude, r.call(_A.sin.default, imaginary)),
    )


def _part(index: int) -> Rule:
    def rule(r: _Rewriter, node: torch.fx.Node) -> Any:
        return r.call(_A.select.int, r.pair_of(_args(node)[0]), -1, index)

    return rule


def _magnitude(r: _Rewriter, node: torch.fx.Node) -> Any:
    pair = r.pair_of(_args(node)[0])
    return r.call(_A.sqrt.default, r.call(_A.sum.dim_IntList, r.call(_A.mul.Tensor, pair, pair), [-1]))


def _angle(r: _Rewriter, node: torch.fx.Node) -> Any:
    real, imaginary = r.parts(_args(node)[0])
    return r.call(_A.atan2.default, imaginary, real)


def _dropped(r: _Rewriter, node: torch.fx.Node) -> Any:
    return None  # an assertion on the complex tensor's metadata: nothing reads it


class _Unsupported(Exception):
    """A complex op this module has no rule for, or a form of one it does not take."""


_RULES: dict[Any, Rule] = {
    _A.view_as_complex.default: _view_as_complex,
    _A.view_as_real.default: lambda r, node: r.pair_of(_args(node)[0]),
    _A.polar.default: _polar,
    _A.complex.default: _complex_of,
    _A.mul.Tensor: _product,
    _A.mul.Scalar: _product,
    _A.div.Tensor: _quotient,
    _A.div.Scalar: _quotient,
    _A.add.Tensor: _sum_or_difference,
    _A.sub.Tensor: _sum_or_difference,
    _A.neg.default: _same_on_pair(),
    _A.conj.default: _conjugate,
    _A._conj.default: _conjugate,
    _A.conj_physical.default: _conjugate,
    _A.resolve_conj.default: _same_on_pair(),
    _A.exp.default: _exp,
    _A.real.default: _part(0),
    _A.imag.default: _part(1),
    _A.abs.default: _magnitude,
    _A.angle.default: _angle,
    _A.clone.default: _same_on_pair(),
    _A.alias.default: _same_on_pair(),
    _A.detach.default: _same_on_pair(),
    _A.lift_fresh_copy.default: _same_on_pair(),
    _A._to_copy.default: _to_copy,
    _A.unsqueeze.default: _same_on_pair((1,)),
    _A.squeeze.dim: _same_on_pair((1,)),
    _A.squeeze.dims: _same_on_pair((1,)),
    _A.select.int: _same_on_pair((1,)),
    _A.slice.Tensor: _same_on_pair((1,)),
    _A.transpose.int: _same_on_pair((1, 2)),
    _A.flatten.using_ints: _same_on_pair((1, 2)),
    _A.index_select.default: _same_on_pair((1,)),
    _A.index.Tensor: _same_on_pair(),  # indices on the leading axes: the pair's axis stays last
    _A.sum.dim_IntList: _same_on_pair((1,)),
    _A.mean.dim: _same_on_pair((1,)),
    _A.view.default: _with_pair_size,
    _A._unsafe_view.default: _with_pair_size,
    _A.reshape.default: _with_pair_size,
    _A.expand.default: _with_pair_size,
    _A.permute.default: _permute,
    _A.repeat.default: _repeat,
    _A.cat.default: _join_lists,
    _A.stack.default: _join_lists,
    _A.pad_sequence.default: _pad_sequence,
    _A._assert_tensor_metadata.default: _dropped,
    _A.split.Tensor: _same_on_pair((2,)),
    _A.split_with_sizes.default: _same_on_pair((2,)),
    _A.chunk.default: _same_on_pair((2,)),
    _A.unbind.int: _same_on_pair((1,)),
    operator.getitem: lambda r, node: r.call(operator.getitem, r.pair(_args(node)[0]), _args(node)[1]),
}


def _touches_complex(node: torch.fx.Node) -> bool:
    return _is_complex_node(node) or any(_is_complex_node(a) or _is_complex_list(a) for a in node.all_input_nodes)


def complex_as_real(program: torch.export.ExportedProgram) -> int:
    """Rewrite ``program``'s complex ops as real ones (the module doc), in place; returns how many ops were
    rewritten (0: the program has none, or one this module cannot rewrite, and is unchanged)."""
    graph = program.graph_module.graph
    touched = [n for n in graph.nodes if _touches_complex(n)]
    if not touched:
        return 0
    stored = {
        spec.arg.name
        for spec in program.graph_signature.input_specs
        if spec.kind != torch.export.graph_signature.InputKind.USER_INPUT
    }
    blocked = _first_blocker(touched, stored)
    if blocked is not None:
        logger.debug("complex ops left to the exporter: %s", blocked)
        return 0
    rewriter = _Rewriter(graph)
    replacements: dict[torch.fx.Node, Any] = {}
    try:
        for node in touched:
            rewriter.node = node
            if node.op == "placeholder":  # a stored complex tensor: read as its pair, the placeholder kept
                with graph.inserting_after(node):
                    rewriter.pairs[node] = rewriter.call(_A.view_as_real.default, node)
                continue
            with graph.inserting_before(node):
                new = _RULES[node.target](rewriter, node)
            if _is_complex_node(node) or _is_complex_list(node):
                rewriter.pairs[node] = new
            else:
                replacements[node] = new
    except _Unsupported as exc:  # only the new nodes read what was written: removed, the program is as it was
        logger.debug("complex ops left to the exporter: %s", exc)
        for written in reversed(rewriter.written):
            graph.erase_node(written)
        return 0
    for node, new in replacements.items():
        if new is not None:
            node.replace_all_uses_with(new)
    for node in reversed(touched):
        if node.op != "placeholder":
            graph.erase_node(node)
    program.graph_module.recompile()
    logger.debug("%d complex op(s) written as real ops", len(touched))
    return len(touched)


def _first_blocker(touched: list[torch.fx.Node], stored: set[str]) -> str | None:
    """Why the program's complex ops cannot be rewritten, or None when they can (``stored``: the placeholders of
    weights, buffers and constants, which are read as their real pairs)."""
    for node in touched:
        if node.op == "placeholder" and node.name in stored:
            continue
        if node.op != "call_function":
            return f"a complex {node.op} ({node.name})"
        if node.target not in _RULES:
            return f"{node.target} on a complex tensor ({node.name})"
        if node.target is operator.getitem and not _is_complex_list(node.args[0]):
            return f"an item of a value that is not a list of complex tensors ({node.name})"
        listed = _is_complex_list(node)  # its getitem users are rewritten with it
        for user in node.users:
            if user.op == "output" or (user.op == "call_function" and user.target is operator.getitem and not listed):
                return f"a complex value {node.name} leaves the program or is a tuple"
    return None
