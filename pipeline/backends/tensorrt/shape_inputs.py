"""Inputs whose values size tensors in the graph: TensorRT reads them as *shape tensors*, whose values every
optimization profile must hold (Pixtral's ``image_sizes``: the patches are cropped to ``size // patch`` with
``.item()``; LightOnOCR, Mistral 3). Without values in the profile the builder fails with only "Invalid Engine".

:func:`shape_value_candidates` finds, in the ONNX graph, the small integer inputs whose values reach an input that
sizes a tensor (``Reshape``'s shape, ``Slice``'s bounds, ``Range``, ``Expand``, ...) through any chain of nodes but
``Shape``/``Size`` (which read only the metadata): a superset of what the parser marks. A conversion takes their
values from the sample for ``settings.shape_tensor_values`` (the engine then takes exactly those); the build gives
the profile values only for the inputs the parser does mark (:func:`profile_values`). A generation step's
``past_length`` (a shape tensor where the step hands the model the cache positions written so far) spans the whole
cache instead (:func:`known_ranges`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx

logger = logging.getLogger(__name__)

#: Op -> the input positions whose values are sizes, axes or counts.
SHAPE_SLOTS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,),
    "Expand": (1,),
    "Slice": (1, 2, 3, 4),
    "Range": (0, 1, 2),
    "ConstantOfShape": (0,),
    "Tile": (1,),
    "Resize": (2, 3),
    "Upsample": (1,),
    "TopK": (1,),
    "Pad": (1,),
    "Split": (1,),
    "Squeeze": (1,),
    "Unsqueeze": (1,),
    "OneHot": (1,),
    "CumSum": (1,),  # an axis TensorRT needs at build time
    **{
        f"Reduce{kind}": (1,)
        for kind in ("Sum", "Mean", "Max", "Min", "Prod", "L1", "L2", "LogSum", "LogSumExp", "SumSquare")
    },
}
#: At most this many values: a shape tensor holds a few sizes, not data.
MAX_VALUES = 64
_INTEGERS = {onnx.TensorProto.INT32, onnx.TensorProto.INT64}


def shape_value_candidates(model: onnx.ModelProto) -> list[str]:
    """The graph's static integer inputs of at most :data:`MAX_VALUES` values whose values reach a sizing input."""
    found = []
    for value in model.graph.input:
        tensor = value.type.tensor_type
        if tensor.elem_type not in _INTEGERS or not all(d.HasField("dim_value") for d in tensor.shape.dim):
            continue
        if int(np.prod([d.dim_value for d in tensor.shape.dim], dtype=np.int64)) > MAX_VALUES:
            continue
        if _reaches_a_size(model.graph, value.name):
            found.append(value.name)
    return found


def _reaches_a_size(graph: onnx.GraphProto, name: str) -> bool:
    derived, changed = {name}, True
    while changed:
        changed = False
        for node in graph.node:
            if node.op_type in ("Shape", "Size"):
                continue  # metadata only
            slots = SHAPE_SLOTS.get(node.op_type, ())
            if any(i in slots and x in derived for i, x in enumerate(node.input)):
                return True
            if any(x in derived for x in node.input) and not derived.issuperset(o for o in node.output if o):
                derived.update(o for o in node.output if o)
                changed = True
    return False


#: A generation step's input holding the cache position its run starts at: a shape tensor where the step hands the
#: model the cache positions written so far (GPT-Neo's, FSMT's, Kosmos-2's steps slice the cache by it).
PAST_LENGTH = "past_length"
#: A shape tensor's (min, opt, max) values in a profile.
ValueRange = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]


def known_ranges(settings: Any) -> dict[str, ValueRange]:
    """The ranges of the shape tensors the settings decide: a generation step's :data:`PAST_LENGTH`, every position
    of its cache (0 to ``max_length - 1``), not the sample's one value."""
    generation = getattr(settings, "generation", None)
    if generation is None:
        return {}
    # opt 0: a prefill of any length the profiles take fits the cache there (the builder refuses a profile whose opt
    # shapes write past the cache: "Invalid Engine"); the decode profile's opt is a half-full cache (with_values)
    return {PAST_LENGTH: ((0,), (0,), (generation.max_length - 1,))}


def profile_values(network: Any, settings: Any) -> dict[str, ValueRange]:
    """The values each shape-tensor input of the parsed ``network`` takes in every profile: its range where the
    settings decide it (:func:`known_ranges`), else exactly ``settings.shape_tensor_values``; a missing one is the
    BuildError naming it."""
    from converters.errors import BuildError

    given = dict(settings.shape_tensor_values)
    known = known_ranges(settings)
    names = [network.get_input(i).name for i in range(network.num_inputs) if network.get_input(i).is_shape_tensor]
    for name in sorted(set(given) & set(known) & set(names)):
        logger.warning(
            "shape_tensor_values[%r] is not used: a generation step's %s takes every cache position, %s to %s, in its "
            "engine's profiles (generation's max_length decides it)",
            name,
            name,
            known[name][0][0],
            known[name][2][0],
        )
    missing = [n for n in names if n not in given and n not in known]
    if missing:
        raise BuildError(
            f"TensorRT reads input(s) {', '.join(map(repr, missing))} as shape tensors (their values size tensors "
            "in the graph), and every profile needs their values, which shape_tensor_values does not give",
            fix=f"pass shape_tensor_values={{{missing[0]!r}: [...]}} with the values the engine is to take (a "
            "conversion that gives none takes the sample's), or convert with backend='onnxruntime'",
        )
    return {n: known[n] if n in known else (given[n], given[n], given[n]) for n in names}


def with_values(profiles: Sequence[Any], values: Mapping[str, ValueRange], settings: Any = None) -> list[Any]:
    """Polygraphy profiles (one made when there are none) with each shape tensor's (min, opt, max) ``values``; in a
    generation step's decode profile (``settings.profiles``' one whose sequence is 1), :data:`PAST_LENGTH`'s opt is a
    half-full cache rather than an empty one (the prefill profile's)."""
    from polygraphy.backend.trt import Profile

    out = list(profiles) or [Profile()]
    for index, profile in enumerate(out):
        for name, (low, opt, high) in values.items():
            if name == PAST_LENGTH and _decodes(settings, index):
                opt = tuple((h + 1) // 2 for h in high)
            profile.add(name, min=low, opt=opt, max=high)
    return out


def _decodes(settings: Any, index: int) -> bool:
    """Whether profile ``index`` of ``settings`` is a generation step's decode profile (its sequence exactly 1)."""
    if settings is None or getattr(settings, "generation", None) is None or index >= len(settings.profiles):
        return False
    return any(r.name == "sequence" and r.max == 1 for r in settings.profiles[index])
