"""An artifact's metadata against its own graph: every field the runtime relies on, compared on load.

The manifest proves that the members are the ones written, not that they agree: a forger who knows the format
re-hashes them, and a metadata that says ``max_length`` 64 over a graph whose cache holds 32 positions would load and
then fail inside ONNX Runtime (``Got invalid dimensions for input: attention_mask``). Each check here reads the graph's
declarations only (names, element types, fixed dimensions, node attributes), never a weight, so a load stays fast;
each returns the disagreement in words (the field, the metadata's value and the graph's), None when they agree, and
:func:`pipeline.runtime.artifact_reading.read_artifact` raises it as an ArtifactError.
"""

from __future__ import annotations

from collections.abc import Callable

import onnx

from converters.block_settings import FOUR_BIT_PRECISIONS
from converters.settings import GenerationSettings
from pipeline.runtime.generation.layout import INDEXER, STATE_KINDS, STEP_INPUTS, past_name, present_name
from pipeline.runtime.io_spec import IOSpec
from pipeline.settings import DynamicDim, Settings

#: Where the values checked come from: the artifact's metadata member (``pipeline.runtime.artifact.METADATA_MEMBER``).
METADATA = "metadata.json"
#: The axis of a cache tensor [batch, kv_heads, positions, head_dim] that holds its positions (``layout``).
CACHE_POSITIONS_AXIS = 2
#: The ops whose ``block_size`` attribute is the block of a 4-bit weight (``precision="int4"`` or ``"nvfp4"``).
BLOCK_QUANTIZED_OPS = ("DequantizeLinear", "MatMulNBits")

Dims = dict[str, list[int | None]]  # graph input or output name -> each axis's fixed size (None: dynamic)


def io_disagreement(io: IOSpec, model: onnx.ModelProto) -> str | None:
    """Where the I/O spec the module calls with is not the graph's: names, element types and ranks, in order; and
    every axis the graph fixes, which the spec must fix at that size (an output's symbolic axis is left alone)."""
    for kind, specs, values in (("input", io.inputs, model.graph.input), ("output", io.outputs, model.graph.output)):
        graph_side = [(v.name, _dtype_name(v), len(v.type.tensor_type.shape.dim)) for v in values]
        spec_side = [(t.name, t.dtype, len(t.shape)) for t in specs]
        if graph_side != spec_side:
            return f"the I/O spec's {kind}s {spec_side} do not match the graph's {graph_side}"
        for spec, value in zip(specs, values, strict=True):
            for axis, (declared, fixed) in enumerate(zip(spec.shape, _fixed_dims(value), strict=True)):
                # the module lets through what its spec allows: a size the graph's fixed axis refuses would reach
                # ONNX Runtime (INVALID_ARGUMENT) on the first call; an output's size is what buffers are made with
                differs = declared != fixed if kind == "input" else isinstance(declared, int) and declared != fixed
                if fixed is not None and differs:
                    return f"{kind} {spec.name!r} axis {axis} is {declared!r} in {METADATA}, {fixed} in the graph"
    return None


def settings_disagreement(settings: Settings, model: onnx.ModelProto) -> str | None:
    """Where the settings the runtime reads do not describe this graph: a declared dynamic axis the graph lacks or
    fixes, a generation step's cache (layers, capacity, batch, prompt) that is not the graph's, a 4-bit graph's
    blocks that are not ``block_size``."""
    inputs = {value.name: _fixed_dims(value) for value in model.graph.input}
    reason = _dynamic_disagreement(settings.dynamic, inputs)
    if reason is None and settings.generation is not None:
        outputs = {value.name: _fixed_dims(value) for value in model.graph.output}
        reason = _generation_disagreement(settings.generation, settings.dynamic, inputs, outputs)
    if reason is None and settings.precision in FOUR_BIT_PRECISIONS and settings.block_size is not None:
        reason = _block_size_disagreement(settings.block_size, model)
    return reason


def _dynamic_disagreement(dynamic: tuple[DynamicDim, ...], inputs: Dims) -> str | None:
    for dim in dynamic:
        where = f"dynamic dimension {dim.name!r} (input {dim.input!r} axis {dim.axis}) in {METADATA}"
        if dim.input not in inputs:
            return f"{where}, but the graph has no input {dim.input!r}"
        dims = inputs[dim.input]
        if not 0 <= dim.axis < len(dims):
            return f"{where}, but the graph has no such input axis (the input has {len(dims)})"
        if (fixed := dims[dim.axis]) is not None:
            return f"{where}, but the graph fixes that axis at {fixed}"
    return None


def _generation_disagreement(
    generation: GenerationSettings, dynamic: tuple[DynamicDim, ...], inputs: Dims, outputs: Dims
) -> str | None:
    """A cached decoder step: its step inputs, and each generation field the decoding loop sizes its buffers and
    calls with (the cache's layers and capacity, the batch, the prefill chunk) against the graph."""
    seq2seq = generation.kind == "encoder-decoder"
    required = ("input_ids", "encoder_attention_mask", "past_length") if seq2seq else STEP_INPUTS
    missing = [name for name in required if name not in inputs]
    if missing:
        return (
            f"settings.generation in {METADATA} makes it a cached decoder step, but the graph lacks the step "
            f"input(s) {', '.join(missing)}"
        )
    layers, presents = _cache_layers(inputs, past_name), _cache_layers(outputs, present_name)
    if generation.layers != layers:
        held = f"{layers} cached layer(s) ({past_name(0, 'key')} to {past_name(layers - 1, 'value')})"
        return (
            f"generation.layers is {generation.layers} in {METADATA}, but the graph holds "
            f"{held if layers else 'no cache inputs'}"
        )
    if presents != layers:
        outputs_held = f"its cache outputs ({present_name(0, 'key')}, ...) {presents}"
        return f"the graph's cache inputs hold {layers} layer(s), {outputs_held}"
    if seq2seq:  # no decoder mask nor positions: the decoder's positions are the cache's length
        return _capacity_disagreement(generation.max_length, inputs, outputs, layers, mask=False)
    return (
        _capacity_disagreement(generation.max_length, inputs, outputs, layers)
        or _batch_disagreement(generation.max_batch, inputs, dynamic)
        or _prompt_disagreement(generation.max_prompt or generation.max_length, inputs, dynamic)
        or _token_disagreement(generation, outputs)
    )


def _cache_layers(names: Dims, name_of: Callable[[int, str], str]) -> int:
    """One more than the last layer with both a ``key`` and a ``value`` tensor among ``names``, or a recurrent state
    (``conv``, ``recurrent``: a layer of linear attention, a convolution or a state-space mixer); a hybrid stack's
    layers without a cache (Nemotron-H's MLP layers) hold none between them."""
    before = name_of(0, "key").split("0", 1)[0]  # "past_key_values." or "present."
    layers = {int(d) for d in (n[len(before) :].split(".", 1)[0] for n in names if n.startswith(before)) if d.isdigit()}
    held = [
        i
        for i in layers
        if (name_of(i, "key") in names and name_of(i, "value") in names)
        or any(name_of(i, kind) in names for kind in STATE_KINDS)
    ]
    return max(held) + 1 if held else 0


def _capacity_disagreement(max_length: int, inputs: Dims, outputs: Dims, layers: int, mask: bool = True) -> str | None:
    """``max_length`` is the width of the attention mask (``mask``: a decoder-only step has one) and the positions
    of every cache tensor."""
    sized = [("attention_mask", inputs["attention_mask"], 1)] if mask else []
    for layer in range(layers):
        for kind in (kind for kind in ("key", "value", INDEXER) if past_name(layer, kind) in inputs):
            sized.append((past_name(layer, kind), inputs[past_name(layer, kind)], CACHE_POSITIONS_AXIS))
            sized.append((present_name(layer, kind), outputs[present_name(layer, kind)], CACHE_POSITIONS_AXIS))
    for name, dims, axis in sized:
        fixed = dims[axis] if axis < len(dims) else None
        if fixed is not None and fixed != max_length:
            return (
                f"generation.max_length is {max_length} in {METADATA}, but the graph's cache holds {fixed} positions "
                f"({name!r} axis {axis} is {fixed})"
            )
    return None


def _batch_disagreement(max_batch: int, inputs: Dims, dynamic: tuple[DynamicDim, ...]) -> str | None:
    """``max_batch`` is the graph's batch when the graph fixes it, and within the declared batch range otherwise."""
    dims = inputs["input_ids"]
    fixed = dims[0] if dims else None
    if fixed is not None and fixed != max_batch:
        return (
            f"generation.max_batch is {max_batch} in {METADATA}, but the graph fixes the batch at {fixed} "
            "('input_ids' axis 0)"
        )
    declared = _declared(dynamic, "input_ids", 0)
    if declared is not None and max_batch > declared.max:
        return (
            f"generation.max_batch is {max_batch} in {METADATA}, above the batch range the graph was converted for "
            f"({declared.name!r} [{declared.min}, {declared.max}] on 'input_ids' axis 0)"
        )
    return None


def _prompt_disagreement(max_prompt: int, inputs: Dims, dynamic: tuple[DynamicDim, ...]) -> str | None:
    """A prefill chunk (``max_prompt`` tokens) must fit one step: input_ids axis 1, fixed or within its range."""
    dims = inputs["input_ids"]
    if len(dims) < 2:
        return None
    declared = _declared(dynamic, "input_ids", 1)
    if dims[1] is not None:
        longest, how = dims[1], f"'input_ids' axis 1 is fixed at {dims[1]}"
    elif declared is not None:
        longest, how = declared.max, f"'input_ids' axis 1 is {declared.name!r} [{declared.min}, {declared.max}]"
    else:
        return None
    if max_prompt > longest:
        return (
            f"generation.max_prompt is {max_prompt} in {METADATA}, but the graph takes at most {longest} tokens per "
            f"step ({how})"
        )
    return None


def _token_disagreement(generation: GenerationSettings, outputs: Dims) -> str | None:
    """The pad token (fed to the step for the rows that stopped) and the eos tokens are within the vocabulary, the
    width of the logits when the graph fixes it."""
    logits = outputs.get("logits") or [None]
    vocabulary = logits[-1]
    named = [("eos_token_id", i) for i in generation.eos_token_id]
    named += [("pad_token_id", generation.pad_token_id)] if generation.pad_token_id is not None else []
    for name, token in named:
        if vocabulary is not None and not 0 <= token < vocabulary:
            return (
                f"generation.{name} is {token} in {METADATA}, outside the graph's vocabulary [0, {vocabulary}) (the "
                "width of 'logits')"
            )
    return None


def _declared(dynamic: tuple[DynamicDim, ...], name: str, axis: int) -> DynamicDim | None:
    return next((d for d in dynamic if d.input == name and d.axis == axis), None)


def _block_size_disagreement(block_size: int, model: onnx.ModelProto) -> str | None:
    """A 4-bit graph's block-quantized weights use ``block_size`` (the first that does not is named)."""
    for node in model.graph.node:
        if node.op_type not in BLOCK_QUANTIZED_OPS:
            continue
        block = next((a.i for a in node.attribute if a.name == "block_size"), 0)
        if block and block != block_size:
            return (
                f"block_size is {block_size} in {METADATA}, but the graph's 4-bit weights are in blocks of {block} "
                f"({node.op_type} {node.name!r} block_size)"
            )
    return None


def _fixed_dims(value: onnx.ValueInfoProto) -> list[int | None]:
    """Each axis's fixed size in the graph, None where it is dynamic."""
    return [d.dim_value if d.HasField("dim_value") else None for d in value.type.tensor_type.shape.dim]


def _dtype_name(value: onnx.ValueInfoProto) -> str:
    """The element type of a graph input or output, by the name the I/O spec uses (``float32``, ``bfloat16``)."""
    elem = value.type.tensor_type.elem_type
    return str(onnx.helper.tensor_dtype_to_np_dtype(elem)) if elem != onnx.TensorProto.BFLOAT16 else "bfloat16"
