"""transformers' output classes for ``generate(..., return_dict_in_generate=True)``: transformers is imported
here only, and only when a caller asks for its objects."""

from __future__ import annotations

from typing import Any

import torch

from converters.errors import InputError
from pipeline.runtime.generation.beam_search import BeamResult
from pipeline.runtime.generation.options import GenerateOptions


def decoder_only_output(
    sequences: torch.Tensor,
    scores: list[torch.Tensor] | None,
    logits: list[torch.Tensor] | None,
    options: GenerateOptions,
    encoder_decoder: bool = False,
) -> Any:
    """``GenerateDecoderOnlyOutput`` (``GenerateEncoderDecoderOutput`` for an encoder-decoder): the sequences; the
    processed scores and raw logits of each step when asked."""
    generation = _transformers_generation()
    kind = generation.GenerateEncoderDecoderOutput if encoder_decoder else generation.GenerateDecoderOnlyOutput
    return kind(
        sequences=sequences,
        scores=tuple(scores) if options.output_scores and scores is not None else None,
        logits=tuple(logits) if options.output_logits and logits is not None else None,
    )


def beam_output(result: BeamResult, options: GenerateOptions, encoder_decoder: bool = False) -> Any:
    """``GenerateBeamDecoderOnlyOutput`` (``GenerateBeamEncoderDecoderOutput`` for an encoder-decoder): sequences,
    beam indices; scores and logits when asked."""
    generation = _transformers_generation()
    kind = generation.GenerateBeamEncoderDecoderOutput if encoder_decoder else generation.GenerateBeamDecoderOnlyOutput
    return kind(
        sequences=result.sequences,
        sequences_scores=result.sequences_scores if options.output_scores else None,
        scores=result.scores if options.output_scores else None,
        logits=result.logits if options.output_logits else None,
        beam_indices=result.beam_indices,
    )


def _transformers_generation() -> Any:
    try:
        import transformers.generation as generation
    except ImportError as error:
        raise InputError(
            "return_dict_in_generate=True returns transformers' output classes, and transformers is not installed",
            fix="pip install transformers, or leave return_dict_in_generate out (the sequences come back as a tensor)",
        ) from error
    return generation
