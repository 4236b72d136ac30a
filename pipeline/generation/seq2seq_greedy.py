"""An encoder-decoder's two converted graphs checked whole (:func:`validate_greedy`): the sample's greedy decoding,
token for token against the model's own ``generate`` (or transformers' generic loop, where the model's class wraps it
with its own post-processing), then every step's logits judged by the accuracy policy."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from pipeline.generation.generate_scores import (
    departed,
    follow_tokens,
    greedy_options,
    judged_departure,
    judged_logits,
    prompt_tokens,
    with_decoding,
)
from pipeline.runtime.generation.encoder_decoder import EncoderDecoderModule
from pipeline.settings import Settings

#: Tokens of the greedy decodings compared with the model's own ``generate`` when validating.
VALIDATION_TOKENS = 8
#: The module, as the validation's errors name it.
WHAT = "the converted encoder-decoder"


def validate_greedy(
    model: torch.nn.Module, module: EncoderDecoderModule, inputs: dict[str, torch.Tensor], settings: Settings
) -> None:
    """The sample's greedy decoding, token for token against ``model.generate`` (its own cache), else against
    transformers' generic ``generate`` loop: what the module reproduces, where the model's class wraps it with its own
    post-processing (Whisper's leaves out its decoder prompt and turns a final eos into padding). Then every step's
    logits against the ``generate`` that gave the same tokens (:mod:`pipeline.generation.generate_scores`). A lower
    precision's tokens may part from the model's at a near tie: its steps are then judged fed PyTorch's tokens, and
    the report says where they part (:func:`~pipeline.generation.generate_scores.departed`)."""
    actual = _reference_greedy(module.generate, inputs)
    expected = _reference_greedy(getattr(model, "generate"), inputs)  # noqa: B009 - nn.Module types it as a tensor
    reference: Callable[..., Any] | None = getattr(model, "generate")  # noqa: B009
    apart = False
    if not _same_tokens(expected, actual):
        reference = _generic_generate(model)
        if reference is not None:
            try:
                generic = _reference_greedy(reference, inputs)
            except Exception:  # noqa: BLE001 - the generic loop refuses the inputs only the model's generate takes
                generic = None  # (Pop2Piano's input_features): the tokens differ from the model's, said below
            if generic is None or not _same_tokens(generic, actual):
                reference = None
        if reference is None:  # a half precision's near tie (the model's own layout), else the AccuracyError
            laid_out_alike = expected.shape == actual.shape  # (not Whisper's new tokens only: refused as fp32 is)
            apart = departed(model, WHAT, expected, actual, settings.precision if laid_out_alike else "fp32")
            reference = getattr(model, "generate")  # noqa: B009
    assert reference is not None  # the generic loop, else the model's own with its tokens apart
    with torch.no_grad():
        theirs = reference(**inputs, **greedy_options(VALIDATION_TOKENS))
    follow = {"logits_processor": follow_tokens(theirs.sequences)} if apart else {}
    ours: Any = module.generate(**inputs, **greedy_options(VALIDATION_TOKENS), **follow)
    main = next(iter(inputs.values()))
    tokens = prompt_tokens(inputs.get("attention_mask"), main) if main.dtype == torch.int64 else main.shape[0]
    label = f"sample of {main.shape[0]} row(s), its {next(iter(inputs))}"
    again = functools.partial(reference, **inputs, **greedy_options(VALIDATION_TOKENS))
    judged = judged_logits(ours, theirs, module.decoder.io, settings, label, tokens, again, model)
    if apart:
        width = int(theirs.sequences.shape[1]) - len(theirs.logits)  # the decoder prompt
        judged = judged_departure(judged, model, WHAT, expected, actual, width, settings.precision)
    with_decoding(module.decoder, judged)


def _reference_greedy(generate: Callable[..., Any], inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """``generate``'s greedy tokens for the sample (the same options for the module and the model)."""
    with torch.no_grad():
        return torch.as_tensor(generate(**inputs, max_new_tokens=VALIDATION_TOKENS, do_sample=False, num_beams=1))


def _generic_generate(model: torch.nn.Module) -> Callable[..., Any] | None:
    """transformers' ``GenerationMixin.generate`` bound to ``model`` when the model's class overrides it, else None."""
    from transformers.generation.utils import GenerationMixin

    if not isinstance(model, GenerationMixin) or type(model).generate is GenerationMixin.generate:
        return None
    return functools.partial(GenerationMixin.generate, model)


def _same_tokens(expected: torch.Tensor, actual: torch.Tensor) -> bool:
    """The sequences are equal, or ``expected`` is ``actual`` without its decoder prompt (a model's ``generate``
    may return the new tokens only, as Whisper's does)."""
    width = expected.shape[1]
    if expected.shape[0] != actual.shape[0] or width > actual.shape[1]:
        return False
    return torch.equal(expected, actual[:, actual.shape[1] - width :])
