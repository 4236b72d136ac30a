"""Stage 1: a PyTorch model and a sample become an ONNX graph with an I/O spec (torch.onnx.export, dynamo)."""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import onnx
import onnx_graphsurgeon as gs
import torch
import torch.utils._pytree as pytree

from converters.custom_ops import custom_ops_in, opaque_translations
from converters.errors import ExportError, InputError
from passes.model_io.external_data import WeightFiles
from passes.model_io.graphs import to_graph, to_model
from pipeline.accuracy.uninitialised import mark_uninitialised, uninitialised_in_program
from pipeline.exporting import errors as export_errors
from pipeline.exporting.cache_outputs import forward_without_cache
from pipeline.exporting.io_names import name_dynamic_dims, outputs_in_call_order, rename_io
from pipeline.exporting.patch_stack import translation_patches
from pipeline.exporting.program_fixes import fix_program
from pipeline.exporting.program_weights import (
    check_protobuf_limit,
    restore_lost_initializers,
    save_external,
    weight_bytes,
)
from pipeline.exporting.tracing import traced_program
from pipeline.noise import quiet_third_party
from pipeline.runtime import io_spec
from pipeline.runtime.io_spec import IOSpec, TensorSpec
from pipeline.settings import DynamicDim, Settings

logger = logging.getLogger(__name__)

_ONNX_TO_TORCH: dict[int, str] = {
    onnx.TensorProto.FLOAT: "float32",
    onnx.TensorProto.FLOAT16: "float16",
    onnx.TensorProto.BFLOAT16: "bfloat16",
    onnx.TensorProto.DOUBLE: "float64",
    onnx.TensorProto.INT64: "int64",
    onnx.TensorProto.INT32: "int32",
    onnx.TensorProto.INT16: "int16",
    onnx.TensorProto.INT8: "int8",
    onnx.TensorProto.UINT8: "uint8",
    onnx.TensorProto.BOOL: "bool",
}


@dataclass(frozen=True)
class ExportedGraph:
    """The exporter's ONNX graph, with inputs and outputs renamed after the model's arguments and results."""

    model: onnx.ModelProto
    io: IOSpec
    node_metadata: dict[str, dict[str, str]]
    # the directory of the graph's external weights, when they exceed settings.external_data_threshold; whoever
    # uses the graph keeps this handle (the directory is removed when the last holder goes)
    weights: WeightFiles | None = None
    # the dynamic dimensions as exported: the declared ones, some made multiples of a number the model needs
    dynamic: tuple[DynamicDim, ...] = ()
    # the outputs exported as None, path -> type: transformers cache objects (pipeline.exporting.cache_outputs)
    dropped_outputs: dict[str, str] = field(default_factory=dict)
    # the model's Python branches on tensor data exported as the sample takes them, source line -> the value taken
    # (pipeline.exporting.traced_branches)
    traced_branches: dict[str, str] = field(default_factory=dict)


def export(
    model: torch.nn.Module,
    sample: Any,
    settings: Settings,
    custom_translation_table: dict[Any, Callable[..., Any]] | None = None,
    converter_ops: Iterable[torch._ops.OpOverload] = (),
) -> ExportedGraph:
    """Export ``model`` called on ``sample`` to ONNX, in memory.

    Every ``torch.library`` op the exporter cannot translate becomes an opaque node (its namespace as domain, its
    name as op_type); so does every op of ``converter_ops`` (ops with a registered converter, which overrides the
    exporter's own translation). ``custom_translation_table`` entries (torch op -> onnxscript function) take
    precedence.

    >>> exported = export(torch.nn.Linear(4, 2), torch.randn(3, 4), Settings())  # doctest: +SKIP
    >>> [t.name for t in exported.io.inputs]                                       # doctest: +SKIP
    ['input']
    """
    if not isinstance(model, torch.nn.Module):
        raise InputError(
            f"expected a torch.nn.Module, got {type(model).__name__}",
            fix="pass the model object (an nn.Module instance), not its class or a function",
        )
    signature = io_spec.forward_signature(model)
    args, kwargs = _apart(*io_spec.bind_call(signature, *io_spec.normalise_sample(sample)))
    names, tensors, input_leaves, input_tree = io_spec.input_names_and_leaves(signature, args, kwargs)
    names = _declared_input_names(model, names)
    if not tensors:
        raise InputError("the sample holds no tensor", fix="pass at least one tensor in the sample")
    _check_sample_tensors(names, tensors)
    _check_dynamic(settings.dynamic, names, tensors)

    with eval_mode(model), torch.no_grad():
        try:
            result = model(*args, **kwargs)
        except InputError:
            raise  # said by a stage's own code the model runs (a generation step's attention): already named
        except Exception as exc:
            raise InputError(
                f"the model fails on the sample in PyTorch itself: {type(exc).__name__}: {exc}",
                fix="check the sample's shapes and dtypes against what forward() expects",
            ) from exc
        (out_names, out_tensors, output_leaves, output_tree), python_values = _outputs(
            result, model, args, kwargs, settings
        )
        out_names = io_spec.distinct_output_names(out_names, names)
        complex_outputs = [n for n, t in zip(out_names, out_tensors, strict=True) if t.is_complex()]
        with forward_without_cache(model, result, args, kwargs, python_values) as dropped:
            program, dynamic, branches = _torch_export(
                model,
                signature,
                args,
                kwargs,
                names,
                settings,
                custom_translation_table,
                converter_ops,
                complex_outputs,
            )

    weights = None
    if weight_bytes(program) > settings.external_data_threshold:
        weights = WeightFiles(settings.weights_dir)
        original = save_external(program, weights)
    else:
        original = program.model_proto  # rebuilt from the ONNX IR on every access: read it once
        check_protobuf_limit(original)
    uninitialised = uninitialised_in_program(program.exported_program, out_names)  # its outputs judged by shape
    traced_program = program.exported_program
    del program  # it holds the torch weights only by reference, but nothing needs it now
    exported, metadata = to_graph(original)
    if len(exported.inputs) != len(names) or len(exported.outputs) != len(out_names):
        raise ExportError(
            f"the exporter wrote {len(exported.inputs)} inputs and {len(exported.outputs)} outputs, but the call has "
            f"{len(names)} tensor arguments and the result {len(out_names)} tensors",
            fix="report this model: the exporter dropped or added graph inputs/outputs",
        )
    if outputs_in_call_order(exported, traced_program, result):
        logger.debug("the exported program returned its outputs in another order than the call: put in call order")
    del traced_program
    rename_io(exported, names, out_names)
    name_dynamic_dims(exported, dynamic)
    try:
        proto = to_model(exported, original, metadata)
    except Exception as exc:  # e.g. an attribute graph-surgeon cannot write back (an empty list: no type)
        raise ExportError(
            f"the exported graph could not be written back after renaming its inputs and outputs: "
            f"{type(exc).__name__}: {exc}",
            node=_node_with_empty_list_attribute(exported),
            fix="report this model; meanwhile pass custom_translation_table={op: function} for that op, or register "
            "a converter for it",
        ) from exc
    mark_uninitialised(proto, uninitialised)
    spec = IOSpec(
        inputs=tuple(_tensor_spec(v) for v in proto.graph.input),
        outputs=tuple(_tensor_spec(v) for v in proto.graph.output),
        input_tree=input_tree,
        input_leaves=input_leaves,
        output_tree=output_tree,
        output_leaves=output_leaves,
        signature=io_spec.signature_record(signature),
    )
    for t, out in zip(spec.outputs, out_tensors, strict=True):
        if t.dtype != str(out.dtype).removeprefix("torch."):
            logger.warning("output %s is %s in PyTorch but %s in the graph", t.name, out.dtype, t.dtype)
    return ExportedGraph(proto, spec, metadata, weights, dynamic, dropped, branches)


def _outputs(
    result: Any, model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], settings: Settings
) -> tuple[tuple[list[str], list[torch.Tensor], tuple[io_spec.Leaf, ...], str], bool]:
    """The result's tensor outputs (:func:`io_spec.output_names_and_leaves`), and whether it holds Python values.
    A Python number, bool or string no tensor data made (MaskFormer-Swin's spatial sizes: numbers of the call's
    shapes) is returned by the module as the sample gave it, on a static conversion, where every shape is fixed too;
    made of tensor data (``.item()``) or with dynamic shapes, it is the ExportError naming it."""
    try:
        return io_spec.output_names_and_leaves(result), False
    except ExportError as exc:
        error = export_errors.python_value_error(exc, model, args, kwargs)
        if error is not exc or settings.dynamic:
            raise error from exc
        outputs = io_spec.output_names_and_leaves(result, constants=True)  # an unknown container still raises
        logger.warning(
            "the model returns Python values beside its tensors (%s): the module returns them as the sample gave "
            "them, fixed as the graph's shapes are (no tensor data makes them)",
            exc.message.split(";")[0].removeprefix("output "),
        )
        return outputs, True


def _apart(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The call with every sample tensor that shares memory with an earlier one copied. torch.export traces aliased
    inputs as one (a sample passing one tensor as ``sample`` and ``image_latents`` made a graph that reads
    ``image_latents`` for both), so the graph would tie inputs that only the sample tied."""
    leaves, tree = pytree.tree_flatten((args, kwargs))
    seen: set[int] = set()
    copied = 0
    for index, leaf in enumerate(leaves):
        if not isinstance(leaf, torch.Tensor) or leaf.device.type == "meta" or leaf.numel() == 0:
            continue
        storage = leaf.untyped_storage().data_ptr()
        if storage in seen:
            leaves[index] = leaf.clone()
            copied += 1
        else:
            seen.add(storage)
    if not copied:
        return args, kwargs
    logger.info("%d sample tensor(s) share memory with another input: exported from copies, kept apart", copied)
    new_args, new_kwargs = pytree.tree_unflatten(leaves, tree)
    return tuple(new_args), dict(new_kwargs)


def _torch_export(
    model: torch.nn.Module,
    signature: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    names: list[str],
    settings: Settings,
    translations: dict[Any, Callable[..., Any]] | None,
    converter_ops: Iterable[torch._ops.OpOverload],
    complex_outputs: list[str],
) -> tuple[Any, tuple[DynamicDim, ...], dict[str, str]]:
    """torch.export first (one trace), then the ONNX translation of that program with every custom op opaque; and
    the dynamic dimensions as exported (some made multiples of a number, when the model needs it) and the branches
    on tensor data exported as the sample takes them (source line -> value)."""
    start = time.perf_counter()
    with _quiet_exporter():
        exported, dynamic, branches = traced_program(model, signature, args, kwargs, names, settings.dynamic)
        if complex_outputs:
            raise export_errors.complex_output_error(exported, complex_outputs)
        exported = fix_program(exported)
        # Ops with a converter get an opaque translation whether or not they show yet: built-in ops often appear
        # only once the exporter decomposes (aten.cdist -> aten._cdist_forward); an unused entry costs nothing.
        table = opaque_translations(custom_ops_in(exported), translations, converter_ops)
        try:
            with translation_patches():
                program = torch.onnx.export(
                    exported,
                    args,
                    kwargs=kwargs,
                    dynamo=True,
                    custom_translation_table=dict(table) or None,  # type: ignore[arg-type]
                    opset_version=settings.opset,
                    verbose=False,
                    report=False,
                )
        except Exception as exc:
            missing = export_errors.untranslated_op(exc)
            raise ExportError(
                f"the ONNX translation of the exported program failed: {export_errors.reason(exc)}",
                node=export_errors.failing_op(exc),
                fix=(
                    f"{missing} has no ONNX translation: register a converter for it, "
                    f"@converters.register({missing!r}) (README, 'Writing a converter'), and it is exported as an "
                    "opaque node for the converter to replace"
                    if missing
                    else "pass custom_translation_table={op: function} to convert, or register a converter for the op"
                ),
            ) from exc
    if program is None or program.model is None:
        raise ExportError("torch.onnx.export returned no model", fix="report this model")
    restore_lost_initializers(program.model)
    logger.debug("export took %.2f s (%d custom ops opaque)", time.perf_counter() - start, len(table))
    return program, dynamic, {} if branches is None else dict(branches.taken)


def _declared_input_names(model: torch.nn.Module, names: list[str]) -> list[str]:
    """The graph input names, after the module's own ``onnx_input_names`` mapping (derived name -> graph name), if
    it has one: the cached generation step names its cache inputs ``past_key_values.{i}.key`` as optimum does,
    a name no Python parameter can have."""
    declared = getattr(model, "onnx_input_names", None)
    if not isinstance(declared, dict):
        return names
    return [str(declared.get(name, name)) for name in names]


def _check_sample_tensors(names: list[str], tensors: list[torch.Tensor]) -> None:
    """An empty input exports to a graph nothing can be checked on; a gradient is not kept by an inference graph."""
    for name, tensor in zip(names, tensors, strict=True):
        if tensor.numel() == 0:
            raise InputError(
                f"sample input {name!r} has no elements (shape {list(tensor.shape)}): the graph would be specialised "
                "to that empty shape and validation would compare nothing",
                fix="pass a sample with at least one element per input (size >= 2 on axes you declare dynamic)",
            )
        if tensor.is_complex():
            raise InputError(
                f"sample input {name!r} is {str(tensor.dtype).removeprefix('torch.')}; ONNX graphs for TensorRT have "
                "no complex type",
                fix="pass torch.view_as_real(z) (a float tensor [..., 2]) and call torch.view_as_complex on it inside "
                "forward()",
            )
    grads = [name for name, tensor in zip(names, tensors, strict=True) if tensor.requires_grad]
    if grads:
        warnings.warn(
            f"sample input(s) {', '.join(grads)} require grad; the converted module runs an inference graph and its "
            "outputs carry no grad_fn (no backward through it)",
            stacklevel=3,
        )


def _check_dynamic(dims: tuple[DynamicDim, ...], names: list[str], tensors: list[torch.Tensor]) -> None:
    shapes = dict(zip(names, (t.shape for t in tensors), strict=True))
    for d in dims:
        if d.input not in shapes:
            raise InputError(
                f"dynamic dimension {d.name!r} names input {d.input!r}, which the sample does not have",
                fix=f"the inputs are: {', '.join(names)}",
            )
        shape = shapes[d.input]
        if not -len(shape) <= d.axis < len(shape):
            raise InputError(
                f"input {d.input!r} has rank {len(shape)}; it has no axis {d.axis}",
                fix=f"use an axis in 0..{len(shape) - 1}",
            )
        size = shape[d.axis]
        if size < 2 or not d.min <= size <= d.max:
            raise InputError(
                f"sample input {d.input!r} has size {size} on dynamic axis {d.axis} ({d.name!r}: min={d.min}, "
                f"max={d.max})",
                fix="use a sample whose size on that axis is >= 2 and within [min, max] "
                "(torch.export specialises sizes 0 and 1)",
            )


def _node_with_empty_list_attribute(graph: gs.Graph) -> str | None:
    """``name (domain::op)`` of the first node with an empty list attribute (which has no type to write)."""
    for node in graph.nodes:
        if any(isinstance(v, list | tuple) and not v for v in node.attrs.values()):
            return f"{node.name} ({node.domain or ''}::{node.op})"
    return None


def _tensor_spec(value: onnx.ValueInfoProto) -> TensorSpec:
    tensor_type = value.type.tensor_type
    dtype = _ONNX_TO_TORCH.get(tensor_type.elem_type)
    if dtype is None:
        raise ExportError(
            f"graph input/output {value.name!r} has ONNX type {onnx.TensorProto.DataType.Name(tensor_type.elem_type)}, "
            "which the runtime cannot map to a torch dtype",
            fix="cast that tensor to a float or integer type in forward()",
        )
    shape = tuple(d.dim_param if d.HasField("dim_param") else int(d.dim_value) for d in tensor_type.shape.dim)
    return TensorSpec(value.name, dtype, shape)


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module, *, warn: bool = True) -> Iterator[None]:
    """Run the block with ``model`` in eval mode (dropout off, batch norm on running stats), then restore it;
    ``warn`` logs that a model in training mode was switched."""
    was_training = model.training
    if was_training and warn:
        logger.warning(
            "the model is in training mode; converting it in eval mode (dropout off, batch norm on running stats)"
        )
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """The exporter warns about missing torchvision and prints progress, onnxscript's optimizer logs every constant
    it could not fold: third-party chatter, shown with ``pipeline -v`` (:mod:`pipeline.noise`)."""
    with quiet_third_party():
        yield
