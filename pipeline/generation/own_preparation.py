"""What an encoder-decoder's own code prepares before transformers' generation loop, read from the model's class: its
encoder's input where its class overrides transformers' hook for it (Florence-2 merges its image features into the
encoder's embeddings), the input its own ``generate`` takes first (Pop2Piano's ``input_features``), and what that
``generate`` hands transformers' loop (Pop2Piano's composer embedding)."""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable
from typing import Any

import torch
from transformers.generation.utils import GenerationMixin

from converters.errors import InputError
from pipeline.generation import PLAIN_FORWARD

#: The hook of transformers' ``GenerationMixin.generate`` that computes an encoder-decoder's ``encoder_outputs`` from
#: the inputs given (its default runs ``get_encoder()`` on the inputs that encoder takes).
PREPARATION = "_maybe_prepare_encoder_kwargs_for_generation"


def is_encoder_decoder(model: Any) -> bool:
    """Whether ``model`` is a transformers encoder-decoder (its config says so)."""
    return bool(getattr(getattr(model, "config", None), "is_encoder_decoder", False))


def own_encoder_preparation(model: torch.nn.Module) -> Callable[[dict[str, torch.Tensor]], dict[str, Any]] | None:
    """The model's own preparation of its encoder's inputs in ``generate``, when its class overrides transformers'
    (Florence-2's computes its image features from ``pixel_values`` and merges them at its image tokens before its
    text encoder, which ``get_encoder()`` alone never sees): a function of the inputs given to ``generate`` (by name)
    to the keyword arguments ``generate`` then calls the model with, ``encoder_outputs`` among them. None for a model
    whose ``generate`` prepares its encoder as transformers does (``get_encoder()``, see
    :func:`~pipeline.generation.seq2seq.encode_and_decode`)."""

    default = getattr(GenerationMixin, PREPARATION, None)
    own = getattr(type(model), PREPARATION, None)
    if default is None or own is None or own is default or not is_encoder_decoder(model):
        return None
    main = str(getattr(model, "main_input_name", "input_ids"))

    def prepare(given: dict[str, torch.Tensor]) -> dict[str, Any]:
        kwargs: dict[str, Any] = {name: value for name, value in given.items() if name != main}
        # generate's output options for the encoder: none (the graph returns the cross keys and values only)
        config: Any = copy.copy(getattr(model, "generation_config"))  # noqa: B009 - nn.Module types it as a tensor
        config.output_attentions = config.output_hidden_states = False
        prepared = getattr(model, PREPARATION)(given.get(main), kwargs, main, config)
        return dict(prepared)

    return prepare


def generate_input_name(model: torch.nn.Module) -> str:
    """The encoder input the model's ``generate`` takes first: its ``main_input_name``, unless its class's own
    ``generate`` takes another in its place (Pop2Piano's ``input_features``, see :func:`own_generate_preparation`)."""

    main = str(getattr(model, "main_input_name", "input_ids"))
    own = getattr(type(model), "generate", None)
    if own is None or own is GenerationMixin.generate or not is_encoder_decoder(model):
        return main
    taken = inspect.signature(own).parameters
    first = next((name for name in taken if name != "self"), None)
    if first is None or first in ("inputs", "input_ids", "kwargs", "args") or main in taken:
        return main
    if taken[first].kind not in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY):
        return main
    return first


class _Handed(Exception):  # noqa: N818 - not an error: how the inputs come back out of the model's own generate
    def __init__(self, inputs: dict[str, torch.Tensor]) -> None:
        super().__init__("the inputs a model's own generate hands transformers' loop")
        self.inputs = inputs


class _HandOver:
    """Put between a model's class and transformers' ``GenerationMixin`` (see :func:`own_generate_preparation`):
    its ``generate`` is the generic loop's place, and hands back the tensors it is called with."""

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        if args and isinstance(args[0], torch.Tensor):
            kwargs.setdefault("inputs", args[0])
        raise _Handed({name: value for name, value in kwargs.items() if isinstance(value, torch.Tensor)})


def own_generate_preparation(model: torch.nn.Module) -> Callable[[dict[str, torch.Tensor]], dict[str, Any]] | None:
    """For a model whose class's ``generate`` takes an input its forward does not take as its main one and prepares
    it itself before transformers' generic loop (Pop2Piano's ``main_input_name`` says ``input_ids``; its ``generate``
    takes ``input_features``, puts a composer's embedding in front of them, and calls the loop with
    ``inputs_embeds``): a function of the inputs given to ``generate`` (by name) to the tensors it hands the loop,
    computed by the model's own ``generate`` (run on a copy of the model whose class puts :class:`_HandOver` before
    ``GenerationMixin``, so that the loop is not run). None for any other model (its main input is what its
    ``generate`` takes: transformers' loop prepares it, :func:`~pipeline.generation.seq2seq.encode_and_decode`)."""

    own = getattr(type(model), "generate", None)
    if own is None or own is GenerationMixin.generate or not is_encoder_decoder(model):
        return None
    if generate_input_name(model) == str(getattr(model, "main_input_name", "input_ids")):
        return None
    handing = type(f"_HandOver{type(model).__name__}", (type(model), _HandOver, GenerationMixin), {})
    if handing.__mro__.index(_HandOver) > handing.__mro__.index(GenerationMixin):
        return None

    def prepare(given: dict[str, torch.Tensor]) -> dict[str, Any]:
        proxy = copy.copy(model)  # the same parameters and modules; the class changed on the copy only
        proxy.__class__ = handing
        try:
            own(proxy, **given)
        except _Handed as handed:
            return handed.inputs
        raise InputError(
            f"{type(model).__name__}.generate returned without calling transformers' generate: the encoder inputs it "
            "prepares itself cannot be taken from it",
            fix=f"{PLAIN_FORWARD}, or pass the inputs transformers' generate takes",
        )

    return prepare
