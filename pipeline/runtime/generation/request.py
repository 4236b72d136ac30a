"""One ``generate``/``stream`` request resolved against the converted step: how many tokens, which eos and pad, the
token chooser with its processors, and when a row stops. The checks that need the module (capacity, batch,
vocabulary) are here; those of the options alone are in :mod:`pipeline.runtime.generation.options`."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from converters.errors import InputError
from converters.generation_settings import GenerationSettings
from pipeline.runtime.generation.decoding import DecodingOptions, TokenChooser
from pipeline.runtime.generation.options import GenerateOptions
from pipeline.runtime.generation.processors import ScoreProcessors, UserCriteria, score_processors, user_criteria

#: transformers' default total length when neither max_new_tokens nor max_length is given.
DEFAULT_MAX_LENGTH = 20
#: transformers' default top-k of a draw when none is given (``top_k=0``: none).
DEFAULT_TOP_K = 50


@dataclass
class Decoding:
    """A resolved request: ``new`` tokens at most, the ``eos`` tokens, the token that fills finished rows (``pad``,
    ``None``: they are not filled), the chooser, and a user's criteria."""

    new: int
    eos: tuple[int, ...]
    pad: int | None
    chooser: TokenChooser
    processors: ScoreProcessors
    criteria: UserCriteria | None
    scores_to_criteria: bool = False

    def stops(self, tokens: torch.Tensor) -> torch.Tensor:
        """Which rows end with their last token [rows] (an eos, or the user's criteria)."""
        done = torch.isin(tokens[:, -1], torch.tensor(self.eos, dtype=torch.int64))
        if self.criteria is not None:
            scores = self.chooser.scores if self.scores_to_criteria else None
            done |= self.criteria(tokens, None if scores is None else tuple(scores))
        return done


def resolve(
    options: GenerateOptions, generation: GenerationSettings, ids: torch.Tensor, mask: torch.Tensor, vocab: int | None
) -> Decoding:
    """The decoding of ``options`` for the prompt rows ``ids`` (left padding marked by ``mask``)."""
    new = new_tokens(ids.shape[1], options.max_new_tokens, options.max_length, generation.max_length)
    eos = generation.eos_token_id if options.eos_token_id is None else _ints(options.eos_token_id)
    pad = generation.pad_token_id if options.pad_token_id is None else options.pad_token_id
    pad = pad if pad is not None or not eos else eos[0]  # transformers pads with the first eos when it has no pad
    _check_vocabulary(options, vocab)
    padding = (mask == 0).to(torch.int64).sum(-1) if bool((mask == 0).any()) else None
    processors = score_processors(options, ids.shape[1], padding, eos, options.logits_processor, ids.shape[1] + new)
    top_k = DEFAULT_TOP_K if options.top_k is None else options.top_k or None  # 0: no top-k, as transformers
    sampling = DecodingOptions(
        options.do_sample, options.temperature, top_k, options.top_p, options.repetition_penalty, options.seed
    )
    record = options.return_dict_in_generate and (options.output_scores or options.output_logits)
    chooser = TokenChooser(sampling, processors if processors else None, record=record)
    criteria = user_criteria(options.stopping_criteria)
    fills = bool(eos) or (criteria is not None and criteria.stop_at_eos)  # transformers' has_eos_stopping_criteria
    scores_to_criteria = options.return_dict_in_generate and options.output_scores
    return Decoding(new, eos, pad if fills else None, chooser, processors, criteria, scores_to_criteria)


def check_room(length: int, capacity: int, cache: str = "the text step's cache") -> None:
    """An InputError when a step's cache of ``capacity`` positions holds ``length`` already: no room for one more."""
    if length >= capacity:
        raise InputError(
            f"{cache} is full ({capacity} tokens)",
            fix="pass fewer max_new_tokens, or convert with a larger generation max_length",
        )


def new_tokens(prompt: int, max_new_tokens: int | None, max_length: int | None, capacity: int) -> int:
    """How many tokens to generate after a prompt of ``prompt`` tokens, within the cache's ``capacity``."""
    for name, value in (("max_new_tokens", max_new_tokens), ("max_length", max_length)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise InputError(
                f"{name} must be a positive int, got {value!r}", fix=f"pass e.g. {name}=32, or leave it out"
            )
    new = max_new_tokens if max_new_tokens is not None else (max_length or DEFAULT_MAX_LENGTH) - prompt
    if new < 1:
        raise InputError(
            f"nothing to generate: a prompt of {prompt} tokens and max_length={max_length}",
            fix="pass max_new_tokens=N",
        )
    if prompt >= capacity:
        raise InputError(
            f"a prompt of {prompt} tokens leaves no room in the cache (max_length={capacity})",
            fix=f"shorten the prompt, or convert with generation={{'max_length': {prompt + new}, ...}}",
        )
    if prompt + new > capacity:
        raise InputError(
            f"a prompt of {prompt} tokens plus {new} new ones exceeds the cache capacity max_length={capacity}",
            fix=f"pass max_new_tokens <= {capacity - prompt}, or convert with generation={{'max_length': "
            f"{prompt + new}, ...}}",
        )
    return new


def fill_token(eos: tuple[int, ...], pad: int | None) -> int:
    """What follows a finished beam's end, as transformers' beam search fills it: ``pad_token_id or
    eos_token_id[0]`` when there is an eos (a pad id of 0 counts as none), else -1."""
    if not eos:
        return -1
    return pad if pad else eos[0]


def _check_vocabulary(options: GenerateOptions, vocab: int | None) -> None:
    if vocab is None or not options.bad_words_ids:
        return
    outside = sorted({token for word in options.bad_words_ids for token in word if token >= vocab})
    if outside:
        raise InputError(
            f"bad_words_ids holds token id(s) {outside[:5]} outside the model's vocabulary [0, {vocab})",
            fix="pass ids below the vocabulary size (the model's own tokenizer gives them)",
        )


def _ints(value: int | list[int] | tuple[int, ...]) -> tuple[int, ...]:
    return (int(value),) if isinstance(value, int) else tuple(int(v) for v in value)
