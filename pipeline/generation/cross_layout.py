"""What a decoder whose text cross-attends to its images (Mllama, IDEFICS) hands its forward after the prefill, read
from its own ``generate`` (:func:`cross_layout`): the image inputs, the per-token image masks, the cache layers that
hold image states and the other image states its decode steps are handed. Nothing here reads one architecture's code:
:func:`record_generate` runs ``model.generate`` for two tokens on the sample's first row and records each call of the
model's forward (its tensor arguments, its cache's length per layer right after it, its output).

- **the image inputs** are what the prefill takes and the decode step no longer does (``pixel_values``, Mllama's
  ``aspect_ratio_ids``/``aspect_ratio_mask``);
- **the cross states** are what the decode step reads in their place: the cache layers that did not grow with the new
  token (Mllama's cross-attention layers hold the projected image keys and values there) and the tensors the decode
  step is handed that the prefill was not (IDEFICS's ``image_encoder_embeddings``), each found among the prefill's
  outputs (``image_outputs.last_hidden_state``);
- **the per-token image masks** are the inputs both calls take, one row per token (Mllama's ``cross_attention_mask``,
  IDEFICS's ``image_attention_mask``): which images each token sees.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Sequence
from typing import Any

import torch

from converters.errors import InputError
from pipeline.generation.seq2seq import cache_of
from pipeline.runtime.generation.layout import CachedLayer
from pipeline.runtime.io_spec import normalise_sample

#: Keyword arguments ``generate`` hands the forward that are the text's or the loop's, not the images'.
TEXT_ARGUMENTS = frozenset(
    {
        "input_ids",
        "attention_mask",
        "position_ids",
        "cache",
        "past_key_values",
        "inputs_embeds",
        "use_cache",
        "logits_to_keep",
        "return_dict",
        "cache_position",
        "token_type_ids",
    }
)


def takes_images(model: Any, sample: Any) -> bool:
    """Whether ``model``'s forward takes ``pixel_values`` and ``sample`` (a dict of tensors) holds them: the path of a
    model whose images are not placed at image tokens (:func:`~pipeline.generation.vision_inputs.is_vision_language`
    is asked first)."""
    forward = getattr(model, "forward", None)
    if not callable(forward) or not hasattr(model, "generate"):
        return False
    args, kwargs = normalise_sample(sample)
    given = dict(args[0]) if len(args) == 1 and isinstance(args[0], dict) and not kwargs else kwargs
    try:
        return "pixel_values" in given and "pixel_values" in inspect.signature(forward).parameters
    except (TypeError, ValueError):
        return False


# what the model's generate hands its forward


@dataclasses.dataclass
class _Call:
    """One forward call of ``generate``: its tensor arguments, its cache's length per layer right after it, its
    output."""

    tensors: dict[str, torch.Tensor]
    lengths: list[int]
    output: Any


def record_generate(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> tuple[_Call, _Call]:
    """The prefill and the first decode step of ``model.generate(**inputs)`` (greedy, two new tokens)."""
    calls: list[_Call] = []

    def after(module: torch.nn.Module, args: Any, kwargs: dict[str, Any], output: Any) -> None:
        tensors = {k: v for k, v in kwargs.items() if isinstance(v, torch.Tensor)}
        cache = cache_of(output)
        layers = getattr(cache, "layers", None) or []
        lengths = [_length(layer) for layer in layers]
        calls.append(_Call(tensors, lengths, output))

    handle = model.register_forward_hook(after, with_kwargs=True)
    try:
        with torch.no_grad():
            model.generate(  # type: ignore[operator]
                **inputs, max_new_tokens=2, min_new_tokens=2, do_sample=False, num_beams=1, use_cache=True
            )
    except Exception as error:  # noqa: BLE001 - the model's own generate failing on the sample: said with its cause
        raise InputError(
            f"{type(model).__name__}.generate fails on the generation sample's first row: {type(error).__name__}: "
            f"{' '.join(str(error).split())[:300]}",
            fix="pass the processor's output for the prompts and their images",
        ) from error
    finally:
        handle.remove()
    if len(calls) < 2:
        media = [name for name in inputs if name not in TEXT_ARGUMENTS]
        reason = f"its generate makes {len(calls)} call(s) of its forward for two new tokens"
        raise not_cross_images(model, media, reason)
    return calls[0], calls[1]


def not_cross_images(model: torch.nn.Module, media: Sequence[str], reason: str) -> InputError:
    """The error for a model that takes images but neither places them at image tokens nor cross-attends to them
    from a decode step (BLIP's captioning head, GIT): its images would be dropped by a text-only step."""
    return InputError(
        f"the generation sample holds {', '.join(media) or 'pixel_values'}, which {type(model).__name__} is not "
        "converted with: generation= places images for models with get_image_features whose forward takes "
        "pixel_values (vision-language decoders) and for decoders whose generate hands their decode steps cached "
        f"image states (cross-attended images), and audio for encoder-decoders; this one is neither ({reason})",
        fix="convert its text decoder with a sample of input_ids (and attention_mask) alone, or convert without "
        "generation= for the plain forward",
    )


def _length(layer: Any) -> int:
    keys = getattr(layer, "keys", None)
    return int(keys.shape[-2]) if isinstance(keys, torch.Tensor) and keys.dim() == 4 and keys.numel() else 0


@dataclasses.dataclass(frozen=True)
class CrossLayout:
    """Where a model's images go after its prefill (see the module docstring)."""

    image_inputs: tuple[str, ...]  # the image graph's inputs, in the forward's order
    per_token: tuple[str, ...]  # the per-token image masks (one row per token)
    self_layers: tuple[tuple[int, CachedLayer], ...]  # (cache index, layer) of the layers that grow
    cross_layers: tuple[int, ...]  # cache indices of the layers that hold image states
    states: tuple[tuple[str, tuple[str, ...]], ...]  # (forward argument, path in the prefill's output)
    vocabulary: int

    @property
    def cache_size(self) -> int:
        """The number of layers of the model's cache."""
        return max([i for i, _ in self.self_layers] + list(self.cross_layers)) + 1


def cross_layout(model: torch.nn.Module, sample: dict[str, torch.Tensor]) -> CrossLayout:
    """The layout of ``model``'s images, read from its own ``generate`` on the sample's first row."""
    first = {name: value[:1] for name, value in sample.items()}
    prefill, step = record_generate(model, first)
    prompt = int(first["input_ids"].shape[1])
    name = type(model).__name__
    order = list(inspect.signature(model.forward).parameters)
    images = [n for n in prefill.tensors if n not in TEXT_ARGUMENTS and n not in step.tensors]
    missing = [n for n in images if n not in sample]
    if missing:
        raise InputError(
            f"{name}.generate hands its forward {', '.join(missing)} on the prefill, which the sample does not hold",
            fix="pass the processor's output whole",
        )
    per_token, refused = [], []
    for n in (n for n in prefill.tensors if n in step.tensors and n not in TEXT_ARGUMENTS):
        before, after = prefill.tensors[n], step.tensors[n]
        rowed = before.dim() >= 2 and after.dim() == before.dim() and after.shape[1] == 1
        if rowed and before.shape[1] == prompt and before.shape[2:] == after.shape[2:]:
            per_token.append(n)
        else:
            refused.append(n)
    if refused:
        reason = f"its generate hands every step {', '.join(refused)} whole, not one row per token"
        raise not_cross_images(model, images + refused, reason)
    states = []
    for n in (n for n in step.tensors if n not in TEXT_ARGUMENTS and n not in prefill.tensors):
        path = _found(prefill.output, step.tensors[n])
        if path is None:
            raise InputError(
                f"{name}.generate hands its decode steps {n}, which is none of its prefill's outputs",
                fix="convert without generation= (the plain forward)",
            )
        states.append((n, path))
    self_layers, cross_layers = _cache_roles(model, prefill, step)
    if not cross_layers and not states:
        reason = "its generate hands its decode steps nothing of the images: no cache layer holds them"
        raise not_cross_images(model, images, reason)
    logits = getattr(step.output, "logits", None)
    vocabulary = int(logits.shape[-1]) if isinstance(logits, torch.Tensor) else 0
    images.sort(key=lambda n: order.index(n) if n in order else len(order))
    return CrossLayout(tuple(images), tuple(per_token), self_layers, cross_layers, tuple(states), vocabulary)


def _cache_roles(
    model: torch.nn.Module, prefill: _Call, step: _Call
) -> tuple[tuple[tuple[int, CachedLayer], ...], tuple[int, ...]]:
    """The cache layers that grew by the new token (self-attention) and those that kept their length (image
    states), from the cache after each call."""
    cache = cache_of(step.output)
    layers = list(getattr(cache, "layers", None) or [])
    if not layers or len(prefill.lengths) != len(step.lengths):
        raise InputError(
            f"{type(model).__name__} returned no transformers Cache with use_cache=True",
            fix="convert without generation= (the plain forward), or use a model on transformers' Cache API",
        )
    grown, kept = [], []
    for i, (before, after) in enumerate(zip(prefill.lengths, step.lengths, strict=True)):
        layer = layers[i]
        if after == before + 1:
            keys, values = layer.keys, layer.values
            if keys.shape[1] != values.shape[1] or keys.dtype != values.dtype:
                raise InputError(
                    f"cache layer {i} of {type(model).__name__} holds keys and values of other heads or dtypes",
                    fix="generation= supports caches whose keys and values have the same heads and dtype",
                )
            grown.append((i, CachedLayer.of(keys, values)))
        elif after == before and after > 0:
            kept.append(i)
        else:
            raise InputError(
                f"cache layer {i} of {type(model).__name__} went from {before} to {after} positions with one new "
                "token: neither a self-attention layer nor one holding image states",
                fix="convert without generation= (the plain forward)",
            )
    if not grown:
        raise InputError(
            f"no cache layer of {type(model).__name__} grows with a new token", fix="convert without generation="
        )
    return tuple(grown), tuple(kept)


def _found(output: Any, wanted: torch.Tensor, depth: int = 0) -> tuple[str, ...] | None:
    """The attribute path of a tensor of ``output`` (a ModelOutput, nested) equal to ``wanted``."""
    if depth > 3 or output is None:
        return None
    items = output.items() if hasattr(output, "items") else ()
    for key, value in items:
        if isinstance(value, torch.Tensor):
            if value.shape == wanted.shape and value.dtype == wanted.dtype and torch.equal(value, wanted):
                return (str(key),)
        elif hasattr(value, "items"):
            inner = _found(value, wanted, depth + 1)
            if inner is not None:
                return (str(key), *inner)
    return None


def state_at(output: Any, path: Sequence[str]) -> torch.Tensor:
    """The tensor at ``path`` in ``output`` (a ModelOutput, nested): :attr:`CrossLayout.states`' paths."""
    for key in path:
        output = output[key]
    return output
