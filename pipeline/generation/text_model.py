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
from pipeline.generation.conversion import layout_of
from pipeline.runtime.generation.layout import CachedLayer
from pipeline.runtime.io_spec import is_model_cache

logger = logging.getLogger(__name__)


def language_model_of(
    model: torch.nn.Module, text: dict[str, torch.Tensor], vision: dict[str, torch.Tensor]
) -> tuple[list[CachedLayer], int, torch.nn.Module]:
    """The cached layers, from the cache the model builds on the sample, the vocabulary (the width of the logits) and
    the model the step calls: ``model`` itself, or, when its output holds no cache, the causal LM inside it whose
    output does (BLIP-2 places its image in the embeddings and hands them to its language model, whose output it
    keeps apart and whose ``generate`` its own calls: the step calls that language model with the embeddings)."""
    inner: list[tuple[torch.nn.Module, Any]] = []
    hooks = [
        module.register_forward_hook(lambda module, _args, out: inner.append((module, out)))
        for module in model.modules()
        if module is not model and callable(getattr(module, "generate", None))
    ]
    try:
        out = model(**text, **vision, use_cache=True)
    except Exception as error:  # noqa: BLE001 - the model refusing its own sample: said with its cause
        raise InputError(
            f"{type(model).__name__} fails on the generation sample: {type(error).__name__}: "
            f"{' '.join(str(error).split())[:300]}",
            fix="pass the processor's output for the prompts (image tokens matching the images)",
        ) from error
    finally:
        for hook in hooks:
            hook.remove()
    if not _holds_cache(out):
        for module, output in inner:
            if _holds_cache(output) and isinstance(getattr(output, "logits", None), torch.Tensor):
                logger.info(
                    "vision-language: %s returns no cache; its %s does: the step calls it with the embeddings",
                    type(model).__name__,
                    type(module).__name__,
                )
                return (*layout_of(module, output), module)
    return (*layout_of(model, out), model)


def _holds_cache(out: Any) -> bool:
    """Whether a model's output holds a transformers ``Cache`` (as ``cache`` or ``past_key_values``)."""
    return is_model_cache(getattr(out, "cache", None) or getattr(out, "past_key_values", None))


def check_takes_features(model: torch.nn.Module, language: torch.nn.Module, token: int | None) -> None:
    """An InputError unless the step can give ``language`` (the model the step calls) the image features: as
    embeddings with the features placed (the model's config names its image token), or as its multimodal encoder's
    output."""
    taken = inspect.signature(language.forward).parameters
    if language is not model and token is None:
        raise InputError(
            f"{type(model).__name__} hands its embeddings to {type(language).__name__}, and its config names no image "
            "token to place the image features at",
            fix="convert without generation= (the plain forward)",
        )
    if ("mm_encoder_outputs" if token is None else "inputs_embeds") not in taken:
        raise InputError(
            f"{type(language).__name__}.forward takes no "
            f"{'mm_encoder_outputs (and its config names no image token)' if token is None else 'inputs_embeds'}: "
            "the image features cannot be given to the cached text step",
            fix="convert without generation= (the plain forward)",
        )
