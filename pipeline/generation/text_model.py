"""Which model a vision-language decoder's cached text step calls, and what it caches.

Most image-text-to-text models return their cache and are called by the step themselves (their forward takes the
embeddings with the image features placed). Some hand their embeddings to a causal LM inside them and keep its output
apart, returning no cache of their own: BLIP-2's language model (OPT), whose ``generate`` their own calls. The model is
run once on the sample; when its output holds no cache, the causal LM inside it whose output does (logits and a cache)
is the one the step calls with the embeddings. Nothing here reads one architecture's code.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

import torch

from converters.errors import InputError
from pipeline.generation import PLAIN_FORWARD
from pipeline.generation.model_cache import cache_argument, layout_of
from pipeline.generation.recurrent_state import FirstCallCache, StateLayer
from pipeline.runtime.generation.layout import CachedLayer
from pipeline.runtime.generation.vision_feed import MODALITY_TYPES
from pipeline.runtime.io_spec import is_model_cache

logger = logging.getLogger(__name__)


def language_model_of(
    model: torch.nn.Module,
    text: dict[str, torch.Tensor],
    vision: dict[str, torch.Tensor],
    inner_first: bool = False,
    cache: Any = None,
) -> tuple[list[CachedLayer | StateLayer], int, torch.nn.Module]:
    """The cached layers, from the cache the model builds on the sample, the vocabulary (the width of the logits) and
    the model the step calls: ``model`` itself, or, when its output holds no cache, the causal LM inside it whose
    output does (BLIP-2 places its image in the embeddings and hands them to its language model, whose output it
    keeps apart and whose ``generate`` its own calls: the step calls that language model with the embeddings). With
    ``inner_first`` (a model that places its images by a per-token input, whose forward wants the images at every
    call: Kosmos-2's, whose ``generate`` calls its text model's), that causal LM is the one even when the model
    returns its cache. ``cache``: the cache the model's first call is handed (by its forward's name for it), and a
    cache layer with recurrent states is taken as such (:class:`~pipeline.generation.recurrent_state.StateLayer`).
    A model that makes no cache of its own with ``use_cache=True``, nor any model inside it, is handed an empty
    :class:`~pipeline.generation.recurrent_state.FirstCallCache`, as ``generate`` hands it one (Granite 4 Vision's
    text model)."""
    out, inner = _called(model, {**text, **vision}, cache)
    if cache is None and not _holds_cache(out) and not any(_holds_cache(output) for _, output in inner):
        logger.info("generation: %s makes no cache of its own: its first call is handed one", type(model).__name__)
        cache = FirstCallCache(config=getattr(model, "config", None))
        out, inner = _called(model, {**text, **vision}, cache)
    if inner_first or not _holds_cache(out):
        for module, output in inner:
            if _holds_cache(output) and isinstance(getattr(output, "logits", None), torch.Tensor):
                logger.info(
                    "vision-language: %s returns no cache; its %s does: the step calls it with the embeddings",
                    type(model).__name__,
                    type(module).__name__,
                )
                return (*layout_of(module, output, states=cache is not None), module)
    return (*layout_of(model, out, states=cache is not None), model)


def _called(model: torch.nn.Module, inputs: dict[str, torch.Tensor], cache: Any) -> tuple[Any, list[tuple[Any, Any]]]:
    """The model's output on ``inputs`` with ``use_cache=True`` (handed ``cache`` when it is not None), and the output
    of every model inside it that has a ``generate``, in call order."""
    inner: list[tuple[torch.nn.Module, Any]] = []
    hooks = [
        module.register_forward_hook(lambda module, _args, out: inner.append((module, out)))
        for module in model.modules()
        if module is not model and callable(getattr(module, "generate", None))
    ]
    try:
        given = {} if cache is None else {cache_argument(model): cache}
        return model(**inputs, use_cache=True, **given), inner
    except Exception as error:  # noqa: BLE001 - the model refusing its own sample: said with its cause
        raise InputError(
            f"{type(model).__name__} fails on the generation sample: {type(error).__name__}: "
            f"{' '.join(str(error).split())[:300]}",
            fix="pass the processor's output for the prompts (image tokens matching the images)",
        ) from error
    finally:
        for hook in hooks:
            hook.remove()


def _holds_cache(out: Any) -> bool:
    """Whether a model's output holds a transformers ``Cache`` (as ``cache`` or ``past_key_values``)."""
    return is_model_cache(getattr(out, "cache", None) or getattr(out, "past_key_values", None))


def check_takes_features(
    model: torch.nn.Module, language: torch.nn.Module, token: int | None, placement: str | None = None
) -> None:
    """An InputError unless the step can give ``language`` (the model the step calls) the image features: as
    embeddings with the features placed (the model's config names its image token, or a per-token input of the
    sample marks the image tokens: ``placement``), or as its multimodal encoder's output."""
    if placement is not None:  # the step places the features in the embeddings the model's input embedding gives
        return
    taken = inspect.signature(language.forward).parameters
    if language is not model and token is None:
        raise InputError(
            f"{type(model).__name__} hands its embeddings to {type(language).__name__}, and its config names no image "
            "token to place the image features at",
            fix=PLAIN_FORWARD,
        )
    if ("mm_encoder_outputs" if token is None else "inputs_embeds") not in taken:
        raise InputError(
            f"{type(language).__name__}.forward takes no "
            f"{'mm_encoder_outputs (and its config names no image token)' if token is None else 'inputs_embeds'}: "
            "the image features cannot be given to the cached text step",
            fix=PLAIN_FORWARD,
        )


def ids_placed(
    model: torch.nn.Module,
    language: torch.nn.Module,
    text: dict[str, torch.Tensor],
    token: int | None,
    features: torch.Tensor,
) -> bool:
    """Whether the step hands ``language`` its ``input_ids`` and places the image features in its input embedding's
    output (:func:`~pipeline.generation.vision_step.placed_in_embeddings`) rather than handing it the embeddings: the
    model refuses its embeddings alone where its ids run. Gemma 4 reads its per-layer embeddings by token id; handed
    only ``inputs_embeds``, it reverses its embedding to find the ids, which fails at the image's tokens (their
    embeddings are the image features). False for a model the step calls with embeddings (or with no image token)."""
    from pipeline.generation.vision_step import placed_features, placed_in_embeddings

    if token is None or language is not model or not callable(getattr(model, "get_input_embeddings", None)):
        return False
    ids, mask = text["input_ids"], text["attention_mask"]
    is_image = ids == token
    embedding: Any = model.get_input_embeddings()  # type: ignore[operator]
    try:
        with torch.no_grad():
            model(inputs_embeds=placed_features(embedding(ids), is_image, features), attention_mask=mask)
        return False
    except Exception as error:  # noqa: BLE001 - refused: the ids are tried next, and said why when they run
        refused = f"{type(error).__name__}: {' '.join(str(error).split())[:200]}"
    try:
        with torch.no_grad(), placed_in_embeddings(model, is_image, features):
            model(input_ids=ids, attention_mask=mask)
    except Exception:  # noqa: BLE001 - refused both ways: the step's own call says why
        return False
    logger.info(
        "vision-language: %s refuses inputs_embeds alone (%s): the step hands it input_ids and places the image "
        "features in its input embedding's output",
        type(model).__name__,
        refused,
    )
    return True


def modality_blocks(
    model: torch.nn.Module, text: dict[str, torch.Tensor], vision: dict[str, torch.Tensor], token: int | None
) -> int | None:
    """The value of the sample's :data:`MODALITY_TYPES` at the image tokens, when the model's prefill reads them
    (the step then hands the model its own, that value at the image tokens of a prefill, none after); None when it
    does not. Gemma 4 Unified's (and the larger Gemma 4's) image tokens attend each other both ways in the prefill,
    which only these types say. Read on the sample: the model's logits with the sample's types and without differ, both
    called with the positions the step hands (a model whose positions have one axis: the caller's to decide)."""
    types = text.get(MODALITY_TYPES)
    if token is None or types is None or MODALITY_TYPES not in inspect.signature(model.forward).parameters:
        return None
    ids, mask = text["input_ids"], text["attention_mask"]
    is_image = ids == token
    kinds = types[is_image].unique()
    if kinds.numel() != 1 or not torch.equal(types != 0, is_image):
        return None  # not the image tokens alone, all of one modality: the module refuses such types at generate
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
    called = {"input_ids": ids, "attention_mask": mask, "position_ids": positions, **vision}
    with torch.no_grad():
        given = model(**called, **{MODALITY_TYPES: types}).logits
        without = model(**called).logits
    if torch.allclose(given, without, rtol=1e-5, atol=1e-6):
        return None
    logger.info("vision-language: %s's prefill reads %s: the step hands them", type(model).__name__, MODALITY_TYPES)
    return int(kinds[0])


def placement_input(model: torch.nn.Module, text: dict[str, torch.Tensor], features: int) -> str | None:
    """The per-token input of the sample that marks where the image features go, when the model's config names no
    image token: an integer or boolean input of the model's forward, one per token of ``input_ids``, set at exactly
    as many tokens as the images give features (Kosmos-2's ``image_embeds_position_mask``). None when there is none
    (or more than one such input: which one places is not known)."""
    taken = inspect.signature(model.forward).parameters
    ids = text["input_ids"]
    found = [
        name
        for name, value in text.items()
        if name not in ("input_ids", "attention_mask", "token_type_ids")
        and name in taken
        and value.shape == ids.shape
        and not value.is_floating_point()
        and int((value != 0).sum()) == features
    ]
    return found[0] if len(found) == 1 else None


def generate_feeds(
    model: torch.nn.Module, text: dict[str, torch.Tensor], vision: dict[str, torch.Tensor]
) -> tuple[bool, bool]:
    """How the model's ``generate`` calls its text model, read from a two-token greedy ``generate`` on the sample
    (the first module called with a ``position_ids`` argument, the outermost): whether it hands it positions, and
    whether its second call takes the new token alone (a cache; else the whole sequence again, Kosmos-2's text model
    when its config says ``use_cache=False``)."""
    seen: list[tuple[bool, int]] = []
    first: list[torch.nn.Module] = []

    def record(module: torch.nn.Module, _args: Any, kwargs: dict[str, Any]) -> None:
        if first and module is not first[0]:
            return
        first[:] = [module]
        ids = kwargs.get("input_ids")
        seen.append((isinstance(kwargs.get("position_ids"), torch.Tensor), ids.shape[-1] if ids is not None else -1))

    hooks = []
    for module in model.modules():
        try:
            takes = "position_ids" in inspect.signature(module.forward).parameters
        except (TypeError, ValueError):
            takes = False
        if takes:
            hooks.append(module.register_forward_pre_hook(record, with_kwargs=True))
    generate: Any = getattr(model, "generate")  # noqa: B009 - nn.Module types it as a tensor
    try:
        with torch.no_grad():
            generate(**text, **vision, max_new_tokens=2, do_sample=False)
    finally:
        for hook in hooks:
            hook.remove()
    if len(seen) < 2:
        return True, True
    return seen[0][0], seen[1][1] == 1


def position_offset(language: torch.nn.Module, text: dict[str, torch.Tensor], most: int = 8) -> int:
    """How far the positions ``language`` computes itself when handed none are from the step's
    (``cumsum(attention_mask) - 1``): Kosmos-2 counts its tokens from its padding token's id on (its ``generate``
    hands it no positions). Read on the sample's prompts (text alone): the first offset (up to ``most``) whose
    positions give the model's own logits at every kept token; an InputError when none does."""
    ids, mask = text["input_ids"], text["attention_mask"]
    ours = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
    kept = mask.bool()
    with torch.no_grad():
        own = language(input_ids=ids, attention_mask=mask).logits[kept]
        for offset in range(most + 1):
            given = language(input_ids=ids, attention_mask=mask, position_ids=ours + offset).logits[kept]
            if torch.allclose(given, own, rtol=1e-4, atol=1e-4):
                return offset
    raise InputError(
        f"{type(language).__name__} computes its own positions (its generate hands it none), and they are not the "
        f"prompt's token count moved by at most {most}: the cached step cannot hand them",
        fix=PLAIN_FORWARD,
    )
