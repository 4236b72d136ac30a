"""What went wrong in stage 1 (export), in words: the exporter's innermost reason, the op, and a fix."""

from __future__ import annotations

import contextlib
import functools
import io
import linecache
import os
import re
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import torch

from converters.errors import ExportError

EXPORT_FIXES = (
    "usual fixes: (1) data-dependent Python control flow (`if x.sum() > 0:`) -> torch.cond or a tensor op "
    "such as torch.where; (2) calls torch.export cannot trace (numpy, .item(), print of tensors, external "
    "libraries) -> move them out of forward(); (3) a dynamic dimension the model forces to one value -> drop it "
    "from dynamic=; (4) an op without an ONNX translation -> register a converter; "
    "run torch.export.export(model, args) alone to see the full trace"
)


#: ops that turn tensor data into a Python value (a graph output cannot be one)
_PYTHON_VALUE_OPS = ("aten._local_scalar_dense", "aten.equal", "aten.is_nonzero", "aten.allclose")


def python_value_error(
    exc: ExportError, model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> ExportError:
    """An output that is not a tensor: name the op that made a Python value of tensor data (``.item()``,
    ``torch.equal``, ...), found by running the model once more and watching the ops it calls."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: list[str] = []

    class _Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, a: Any = (), k: Any = None) -> Any:
            if str(func.overloadpacket) in _PYTHON_VALUE_OPS:
                seen.append(str(func))
            return func(*a, **(k or {}))

    try:
        with _Watch():
            model(*args, **kwargs)
    except Exception:  # only a better message is at stake: the original error stands
        return exc
    if not seen:
        return exc
    return ExportError(
        f"{exc.message}: {seen[-1]} turned tensor data into a Python value",
        node=seen[-1],
        fix="return a tensor: (a == b).all() for torch.equal, torch.isclose(a, b).all() for torch.allclose, the "
        "tensor itself instead of .item() / bool(t)",
    )


def torch_export_error(exc: BaseException, padded: str | None = None) -> ExportError:
    """torch.export's failure, with the op and a specific fix when a value depends on the tensors' data. ``padded``:
    PyTorch's own error on the sample with its all-ones attention mask padding one position
    (:func:`padded_mask_failure`), when it fails so."""
    if padded is not None and _BROADCAST.search(reason(exc)):
        return ExportError(
            f"torch.export failed: {reason(exc)}\n    (the model fails in PyTorch too once its attention mask pads "
            f"anything: {padded}; eagerly it drops an all-ones mask, so only unpadded inputs ever ran)",
            node=_where(traced_op(exc), model_frame(exc)),
            fix="the model handles a mask only by dropping it when nothing is padded, which a graph cannot decide "
            "(the mask it builds without one is kept too): fix its mask handling at the line named here (PyTorch's "
            "error above is the same bug), or report it to the model's authors",
        )
    text = f"{reason(exc)}\n{_all_text(exc)}"
    if _UNHASHABLE_SIZE.search(reason(exc)):
        return ExportError(
            f"torch.export failed: {reason(exc)}\n    (the model puts a traced number in a set or a dict key: a "
            "dynamic dimension, or a value read from a tensor with .tolist() / .item(), which the trace holds as a "
            "symbol, not a Python int)",
            node=_where(traced_op(exc), model_frame(exc) or _failing_line(text)),
            fix="at the line named here, compare the numbers instead of hashing them (`len(set(lengths)) > 1` -> "
            "`any(n != lengths[0] for n in lengths)`) or compute with tensors; when a dynamic dimension is hashed, "
            "leave that dimension out of dynamic=",
        )
    if _UNALLOCATED in reason(exc):  # a traced tensor's elements read as numbers: the trace has no values
        line = _model_source(exc)
        return ExportError(
            f"torch.export failed: the model reads a tensor's values as Python numbers{f' (`{line}`)' if line else ''}"
            ", which a trace does not have\n    (an index or a list built element by element from a tensor: `zip(*t)`"
            " or `for x in t`, a tuple of tensors as an index, `torch.tensor([...])` of tensors; or a C++ kernel of "
            "its own reading the data. PyTorch: 'The tensor has a non-zero number of elements, but its data is not "
            "allocated yet')",
            node=_where(traced_op(exc), model_frame(exc)),
            fix="compute it with tensor ops at the line named here: the tensor itself (or torch.stack of the tensors)"
            " as the index, and what the model selects by it with fixed sizes (a mask and torch.where, scatter, a "
            "stable sort) instead of per-row Python lists sized by the data; a C++ kernel -> an opaque custom op "
            "(torch.library) with a converter",
        )
    op = re.search(r"DataDependentOutputException: ([\w.]+)", text)
    data_dependent = ("data-dependent", "GuardOnDataDependentSymNode", "PendingUnbackedSymbolNotFound")
    if op is not None or any(marker in text for marker in data_dependent):
        return ExportError(
            f"torch.export failed: {reason(exc)}\n    (a Python value, a bool, number or shape, is computed from the "
            "tensors' data, which a graph cannot hold)",
            node=_where(op.group(1) if op else traced_op(exc), model_frame(exc) or _failing_line(text)),
            fix="compute with tensors instead: torch.where(...) or torch.cond for an `if` on data, a tensor result "
            "for torch.equal / allclose / .item() / .tolist(), torch._check(...) to tell torch.export a size is "
            "valid; or move that part out of forward()",
        )
    where = _where(traced_op(exc), model_frame(exc))
    if _inside_torch_assertion(exc):
        return ExportError(
            f"torch.export failed: {reason(exc)}\n    (an assertion inside PyTorch's own decomposition of the op "
            "named here, reached from the model's line: a limitation of PyTorch's tracing, most often met on a "
            "tensor whose size comes from data, as after nonzero() or unique(), or on Python lists of such tensors)",
            node=where,
            fix="at the line named here, compute with fixed sizes instead (a mask and torch.where in place of "
            "nonzero()/unique() and per-row lists), or move that part out of forward(); if the line has no "
            "data-dependent size, report it to PyTorch with the op and the line",
        )
    if _NONE_VALUE.search(reason(exc)):  # a default the model fills in only when it runs eagerly
        return ExportError(
            f"torch.export failed: {reason(exc)}\n    (a value that is None under torch.export: models often fill "
            "in an optional input, such as an attention mask, only when they run eagerly)",
            node=where,
            fix="pass that input explicitly in the sample (transformers: attention_mask=torch.ones_like(input_ids)); "
            "else see the line named here",
        )
    keys_or_values = "scaled_dot_product_attention" in (where or "") and _KEY_ARGUMENT.search(reason(exc))
    if _BROADCAST.search(reason(exc)) and keys_or_values:
        return ExportError(
            f"torch.export failed: {reason(exc)}\n    (the attention's keys or values do not fit its queries: their "
            "heads or head size, which eager PyTorch may still run through another kernel)",
            node=where,
            fix="check the model's config: the key/value heads (num_key_value_heads) must divide the query heads "
            "and the query and key head sizes agree; a model whose config makes them so is converted as it is",
        )
    if _BROADCAST.search(reason(exc)) and _in_attention(exc, where):
        return ExportError(
            f"torch.export failed: {reason(exc)}\n    (the attention mask the model builds does not fit its keys: "
            "transformers keeps under torch.export a mask it skips when it runs eagerly with nothing masked, so a "
            "mask built for another length than the keys only fails here)",
            node=where,
            fix="the model's mask length differs from its keys' (a model bug eager PyTorch hides): check it with "
            "model.set_attn_implementation('eager'), which applies the mask when it runs; fix the mask's length at "
            "the line named here, or report it to the model's authors",
        )
    if _BROADCAST.search(reason(exc)):  # shapes PyTorch broadcast when the model ran eagerly (it did, just before)
        return ExportError(
            f"torch.export failed: {reason(exc)}\n    (shapes that did not meet when the model ran eagerly: a branch "
            "it takes otherwise under torch.export, such as an all-ones mask dropped eagerly and kept when traced)",
            node=where,
            fix="the line named here combines two tensors whose shapes disagree only under torch.export: make the "
            "model build them the same way eagerly and traced (pass the mask it builds, or fix its length there)",
        )
    return ExportError(f"torch.export failed: {reason(exc)}", node=where, fix=EXPORT_FIXES)


def padded_mask_failure(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """PyTorch's error (one line) when ``model`` runs on the sample with its all-ones ``attention_mask`` padding the
    last position of each row; None when the sample has no such mask or the model takes the padding."""
    mask = kwargs.get("attention_mask")
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2 or mask.shape[-1] < 2 or not bool((mask == 1).all()):
        return None
    padded = mask.clone()
    padded[:, -1] = 0
    try:
        with torch.no_grad():
            model(*args, **{**kwargs, "attention_mask": padded})
    except Exception as error:  # noqa: BLE001 -- the model's own failure is what the message quotes
        return f"{type(error).__name__}: {' '.join(str(error).split())[:200]}"
    return None


def _in_attention(exc: BaseException, where: str | None) -> bool:
    """Whether torch.export failed inside scaled-dot-product attention (the op, or a frame that calls it)."""
    if "scaled_dot_product_attention" in (where or ""):
        return True
    return any("scaled_dot_product_attention" in linecache.getline(tb.tb_frame.f_code.co_filename, tb.tb_lineno)
               for tb in _frames(exc))  # fmt: skip


#: A shape that does not broadcast (an attention mask of another length than the keys).
_BROADCAST = re.compile(r"Attempting to broadcast a dimension of length \d+")
#: ... of scaled-dot-product attention's keys or values (its arguments 1 and 2; 3 is the mask).
_KEY_ARGUMENT = re.compile(r"Mismatching argument at index [12]\b")

#: a traced number (a symbolic size or a value read from a tensor) put in a set or used as a dict key
_UNHASHABLE_SIZE = re.compile(r"unhashable type: .*Sym(Int|Float|Bool)")
#: PyTorch's error when Python reads the elements of a traced (fake) tensor
_UNALLOCATED = "but its data is not allocated yet"
#: the model's own Python failing on a None (``'NoneType' object is not subscriptable``, ``... has no attribute``)
_NONE_VALUE = re.compile(r"^(TypeError|AttributeError): 'NoneType' object")


def _inside_torch_assertion(exc: BaseException) -> bool:
    """Whether ``exc`` or one of its causes is an ``AssertionError`` raised by PyTorch's own prims, references or
    decompositions (not by the model, nor by an assertion of this package)."""
    torch_dir = Path(torch.__file__).parent
    inside = tuple(f"{torch_dir / part}{os.sep}" for part in ("_prims", "_refs", "_decomp"))
    for error in _chain(exc):
        tb = error.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        if isinstance(error, AssertionError) and tb is not None and tb.tb_frame.f_code.co_filename.startswith(inside):
            return True
    return False


def _where(op: str | None, frame: str | None) -> str | None:
    """``aten.unbind.int, from modeling_x.py:12 in forward``: the op, the model's line, or both."""
    return f"{op}, from {frame}" if op and frame else op or frame


def model_frame(exc: BaseException) -> str | None:
    """``modeling_longt5.py:111 in _split_into_blocks``: the innermost frame of the model's own Python (not
    torch's, the standard library's or ours) on the tracebacks of ``exc`` and its causes; None when there is none."""
    tb = _model_traceback(exc)
    if tb is None:
        return None
    code = tb.tb_frame.f_code
    return f"{code.co_filename.rsplit('/', 1)[-1]}:{tb.tb_lineno} in {code.co_name}"


def _model_source(exc: BaseException) -> str | None:
    """The source text of the line :func:`model_frame` names (``patch_inds[rows, cols] = False``), if any."""
    tb = _model_traceback(exc)
    return None if tb is None else linecache.getline(tb.tb_frame.f_code.co_filename, tb.tb_lineno).strip() or None


def _model_traceback(exc: BaseException) -> TracebackType | None:
    """The innermost traceback entry in the model's own Python (:func:`model_frame`)."""
    found = None
    for tb in _frames(exc):
        if is_model_code(tb.tb_frame.f_code.co_filename):
            found = tb
    return found


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, then its causes (or contexts), each once."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _frames(exc: BaseException) -> Iterator[TracebackType]:
    """Every traceback entry of ``exc`` and of its causes and contexts, outermost first within each."""
    for error in _chain(exc):
        tb = error.__traceback__
        while tb is not None:
            yield tb
            tb = tb.tb_next


def is_model_code(filename: str) -> bool:
    """Whether ``filename`` holds the model's own Python: not torch's, the standard library's or this repository's
    packages'."""
    return not filename.startswith(_not_model_code())


@functools.cache
def _not_model_code() -> tuple[str, ...]:
    """Path prefixes of code that is not the model's: torch, this repository's packages, the standard library."""
    root = Path(__file__).resolve().parents[2]
    dirs = [Path(torch.__file__).parent, *(root / name for name in ("pipeline", "converters", "passes"))]
    return (*(f"{d}{os.sep}" for d in dirs), f"{sysconfig.get_paths()['stdlib']}{os.sep}", "<")


def traced_op(exc: BaseException) -> str | None:
    """The ATen op torch.export was tracing when it failed (``aten.narrow.Tensor``): the innermost dispatch frame's
    ``func`` in the tracebacks of ``exc`` and of its causes; None when no such frame is on them."""
    found = None
    for tb in _frames(exc):
        func = tb.tb_frame.f_locals.get("func")
        if isinstance(func, torch._ops.OpOverload):
            found = str(func)
    return found


def _failing_line(text: str) -> str | None:
    """The user's source line torch.export points at ("... at /path/model.py:12 in forward"), if any."""
    match = re.search(r"(\S+\.py:\d+ in \w+)", text)
    return match.group(1) if match else None


def complex_output_error(exported: torch.export.ExportedProgram, outputs: list[str]) -> ExportError:
    """Complex outputs: the op that first makes a complex tensor from real ones, and what to return instead."""
    first = None
    for node in exported.graph_module.graph.nodes:
        if node.op == "call_function" and _is_complex(node.meta.get("val")):
            inputs = [a.meta.get("val") for a in node.all_input_nodes]
            if not any(_is_complex(v) for v in inputs):
                first = str(node.target)
                break
    return ExportError(
        f"output(s) {', '.join(outputs)} are complex; ONNX graphs for TensorRT have no complex type (the exporter "
        "would give float32 [..., 2] tensors that no longer match the model)",
        node=first,
        fix="return torch.view_as_real(z) from forward() (call torch.view_as_complex on the converted module's "
        "output), or return z.real and z.imag, or z.abs()",
    )


def _is_complex(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.is_complex()
    return isinstance(value, list | tuple) and any(_is_complex(v) for v in value)


def reason(exc: BaseException) -> str:
    """The most specific line of an exporter error: the innermost cause's first lines."""
    inner: BaseException = exc
    while inner.__cause__ is not None:
        inner = inner.__cause__
    text = f"{type(inner).__name__}: {inner}".strip()
    lines = [line for line in text.splitlines() if line.strip()]
    return "\n    ".join(lines[:8])


def untranslated_op(exc: BaseException) -> str | None:
    """``ns::op.overload`` of the op the exporter found no translation for, from its error text."""
    match = re.search(r"No ONNX function found for <OpOverload\(op='([\w.]+)', overload='(\w+)'\)>", _all_text(exc))
    if match is None:
        return None
    namespace, _, name = match.group(1).partition(".")
    return f"{namespace}::{name}.{match.group(2)}"


def _all_text(exc: BaseException) -> str:
    parts = []
    inner: BaseException | None = exc
    while inner is not None:
        parts.append(str(inner))
        inner = inner.__cause__
    return "\n".join(parts)


def failing_op(exc: BaseException) -> str | None:
    """The FX node the exporter names in "Error when translating node ...", if it does."""
    text = str(exc)
    marker = "Error when translating node "
    if marker in text:
        return text.split(marker, 1)[1].split(".", 1)[0][:120]
    return None


def dangling_message(dangling: list[tuple[str, str]]) -> str:
    """The export error for node inputs neither produced by a node nor holding data in the exporter's graph."""
    shown = ", ".join(f"{tensor!r} read by {node!r}" for node, tensor in dangling[:3])
    more = f" and {len(dangling) - 3} more" if len(dangling) > 3 else ""
    return (
        f"torch.onnx.export wrote a graph that reads tensors nothing produces ({shown}{more}): the exporter's "
        "translation or its optimizer (onnxscript) lost them, before any pass of ours ran"
    )


@contextlib.contextmanager
def partial_graph_unprinted() -> Iterator[None]:
    """torch.export prints the partial graph of a trace that fails to stderr before raising (hundreds of lines for a
    transformers model, once per failed trace of the export's retry loop); within the block that print is dropped,
    and everything else written to stderr is passed on when the trace ends. The error itself names the model's line."""
    buffer = io.StringIO()
    try:
        with contextlib.redirect_stderr(buffer):
            yield
    except BaseException as exc:
        partial = getattr(exc, "partial_fx_graph", None)
        text = buffer.getvalue()
        sys.stderr.write(text.replace(f"{partial}\n", "") if isinstance(partial, str) and partial else text)
        raise
    else:
        sys.stderr.write(buffer.getvalue())
