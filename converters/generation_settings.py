"""``generation=``: the settings group that converts a causal language model as one cached decoder step.

Part of :class:`converters.settings.Settings` (which re-exports :class:`GenerationSettings`); its own module so that
the settings object stays readable.
"""

from __future__ import annotations

import dataclasses
import logging
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from converters.errors import InputError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GenerationSettings:
    """``generation=``: convert a transformers causal LM as one cached decoder step (``pipeline.generation``).

    ``max_length`` is the cache capacity (prompt plus new tokens), ``max_batch`` the largest batch, ``max_prompt``
    the longest prompt one prefill step takes (default ``max_length``: the context profile's sequence range).
    ``eos_token_id`` and ``pad_token_id`` default to the model's generation config (filled in at conversion);
    ``layers`` is the number of cached layers (filled in at conversion). ``attention``: ``"onnx"`` (one ONNX
    ``Attention`` node per layer), ``"decomposed"`` (MatMul, Softmax, MatMul with the KV heads kept grouped:
    TensorRT has no fp32 kernel for its attention layer and no softcap), ``"auto"`` (decomposed for an fp32 or
    softcapped graph on a TensorRT backend, else ONNX ``Attention``). ``validation_steps``: the decode steps whose
    logits validation judges after each prompt's prefill (against transformers' own cached ``generate``).

    An encoder-decoder (T5, BART, Whisper, ...) converts as an encoder graph and a decoder step (``kind``
    ``"encoder-decoder"``, filled in at conversion); ``max_prompt`` is then the longest encoder input (source) and
    ``max_length`` the decoder's capacity. ``decoder_start_token_id`` is filled in from the model at conversion.
    ``model_options`` (filled in at conversion, every kind): the options the model's own generation config sets
    (forced and suppressed tokens, sampling, beams, ...), which ``generate`` applies under the caller's as
    ``model.generate`` does. ``kept_window`` (filled in at conversion) is the number of generated
    tokens the model's own cache keeps beside its prompt's where it evicts older ones (a reference sliding window:
    Unlimited-OCR's), which generation then masks out as the model drops them; 0: the model keeps every token.
    ``fixed_inputs`` (filled in at conversion): the sample's scalar options of the model's forward (VibeVoice-ASR's
    ``("sample", False)``), which the converted module's ``generate`` takes with those values only.
    ``prompt_tokens`` (filled in at conversion): the tokens per run of a recurrent model's prompt graph
    (:mod:`pipeline.generation.prompt_graph`), whose step takes one token; 0: no prompt graph, a prompt is fed token
    by token. ``prompt_continues`` (filled in at conversion): whether the prompt graph's runs continue from the states
    the last run left (False: Mamba's multi-token path starts from zero states, so only a prompt's first run takes the
    prompt graph and the tokens after it go one at a time)."""

    max_length: int = 256
    max_batch: int = 4
    max_prompt: int | None = None
    eos_token_id: tuple[int, ...] = ()
    pad_token_id: int | None = None
    layers: int = 0
    attention: str = "auto"
    validation_steps: int = 8
    kind: str = "decoder"
    decoder_start_token_id: int | None = None
    model_options: tuple[tuple[str, Any], ...] = ()
    kept_window: int = 0
    fixed_inputs: tuple[tuple[str, Any], ...] = ()
    prompt_tokens: int = 0
    prompt_continues: bool = True

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InputError(f"unknown generation kind {self.kind!r}", fix=f"use one of {', '.join(KINDS)}")
        object.__setattr__(self, "model_options", tuple((str(k), _frozen(v)) for k, v in self.model_options))
        object.__setattr__(self, "fixed_inputs", tuple((str(k), _frozen(v)) for k, v in self.fixed_inputs))
        if self.decoder_start_token_id is not None:
            start = token_ids("decoder_start_token_id", self.decoder_start_token_id, single=True)[0]
            object.__setattr__(self, "decoder_start_token_id", start)
        if self.attention not in ("auto", "onnx", "decomposed"):
            raise InputError(
                f"unknown generation attention {self.attention!r}", fix="use 'auto', 'onnx' or 'decomposed'"
            )
        object.__setattr__(self, "eos_token_id", token_ids("eos_token_id", self.eos_token_id))
        if self.pad_token_id is not None:
            object.__setattr__(self, "pad_token_id", token_ids("pad_token_id", self.pad_token_id, single=True)[0])
        prompt = self.max_length if self.max_prompt is None else self.max_prompt
        if not all(_is_whole(n) for n in (self.max_length, self.max_batch, prompt)):
            raise InputError(
                f"generation needs whole numbers, got {self}",
                fix="write generation={'max_length': 256, 'max_batch': 4}",
            )
        if not _is_whole(self.validation_steps) or self.validation_steps < 0:
            raise InputError(
                f"generation validation_steps must be a whole number >= 0, got {self.validation_steps!r}",
                fix="write generation={'validation_steps': 8, ...}",
            )
        if not (self.max_length >= 2 and self.max_batch >= 1 and 1 <= prompt <= self.max_length):
            raise InputError(
                f"generation needs max_length >= 2, max_batch >= 1 and 1 <= max_prompt <= max_length, got "
                f"max_length={self.max_length}, max_batch={self.max_batch}, max_prompt={prompt}",
                fix="write generation={'max_length': 256, 'max_batch': 4}",
            )
        object.__setattr__(self, "max_prompt", prompt)

    @property
    def names_prompt_length(self) -> bool:
        """Whether ``max_prompt`` names a length of its own (neither the whole cache nor one token): for a recurrent
        model, its prompt graph asked for with that many tokens per run."""
        return self.max_prompt not in (None, 1, self.max_length)


#: ``decoder``: a causal LM as one cached step; ``encoder-decoder``: an encoder graph and a cached decoder step.
KINDS = ("decoder", "encoder-decoder")


def _frozen(value: Any) -> Any:
    """``value`` with its lists as tuples (the settings are immutable; JSON gives lists back)."""
    if isinstance(value, list | tuple):
        return tuple(_frozen(v) for v in value)
    return value


def token_ids(name: str, value: Any, *, single: bool = False) -> tuple[int, ...]:
    """A token-id setting as a tuple of ints >= 0: an int, or (unless ``single``) a sequence of ints. A string (whose
    characters would be iterated), a bool, a float or anything else is an InputError naming the value and its type.

    >>> token_ids("eos_token_id", [2, 7])
    (2, 7)
    """
    several = not single and isinstance(value, Sequence) and not isinstance(value, str | bytes)
    if _is_whole(value):
        ids: tuple[Any, ...] = (value,)
    elif several and all(_is_whole(i) for i in value):
        ids = tuple(value)
    else:
        wanted = "an int" if single else "an int or a sequence of ints"
        raise InputError(
            f"generation {name} must be {wanted} (token ids), got {value!r} ({type(value).__name__})",
            fix=f"write generation={{'{name}': 2}}" + ("" if single else f" (or '{name}': [2, 7] for several)"),
        )
    negative = [int(i) for i in ids if int(i) < 0]
    if negative:
        raise InputError(
            f"generation {name} {negative} is outside the vocabulary: token ids are >= 0",
            fix=f"pass the {name} of the model's tokenizer (tokenizer.{name})",
        )
    return tuple(int(i) for i in ids)


def check_token_ids(
    settings: GenerationSettings, vocabulary: int, from_model: tuple[str, ...] = ()
) -> GenerationSettings:
    """``settings`` with every token id within ``[0, vocabulary)`` (the width of the model's logits; 0: unknown, not
    checked). An id given outside it is an InputError naming the setting, the id and the vocabulary. ``from_model``
    names the settings read from the model's own generation config instead: an id there outside the vocabulary (a
    shrunk test config keeps its tokenizer's ids) is dropped with a WARNING, as it changes nothing transformers
    does: an eos the model cannot produce never stops a row, and such a pad is not used."""
    named = [("eos_token_id", i) for i in settings.eos_token_id]
    if settings.pad_token_id is not None:
        named.append(("pad_token_id", settings.pad_token_id))
    outside = [(name, i) for name, i in named if vocabulary > 0 and not 0 <= i < vocabulary]
    given = [(name, i) for name, i in outside if name not in from_model]
    if given:
        listed = ", ".join(f"{name}={i}" for name, i in given)
        raise InputError(
            f"generation {listed} outside the model's vocabulary [0, {vocabulary}) (the width of its logits): an "
            "eos the model can never produce, a pad it cannot embed",
            fix="pass the ids of the model's own tokenizer: generation={'eos_token_id': tokenizer.eos_token_id, "
            "'pad_token_id': tokenizer.pad_token_id}",
        )
    if not outside:
        return settings
    logger.warning(
        "generation: %s from the model's generation_config outside its vocabulary [0, %d) (the width of its "
        "logits): dropped (an eos it cannot produce, a pad it cannot embed); pass generation={'eos_token_id': "
        "..., 'pad_token_id': ...} to choose others",
        ", ".join(f"{name}={i}" for name, i in outside),
        vocabulary,
    )
    eos = tuple(i for i in settings.eos_token_id if 0 <= i < vocabulary)
    pad = settings.pad_token_id if ("pad_token_id", settings.pad_token_id) not in outside else None
    return dataclasses.replace(settings, eos_token_id=eos, pad_token_id=pad)


def _is_whole(value: Any) -> bool:
    """An integer that is not a bool (numpy's integers included)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def normalise_generation(value: Any) -> GenerationSettings | None:
    """``generation=`` as given (None, the settings object or a dict of its fields) as :class:`GenerationSettings`."""
    if value is None or isinstance(value, GenerationSettings):
        return value
    if isinstance(value, Mapping):
        known = {f.name for f in fields(GenerationSettings)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise InputError(
                f"unknown generation setting(s) {', '.join(map(str, unknown))}",
                fix=f"known generation settings are: {', '.join(sorted(known))}",
            )
        return GenerationSettings(**{str(k): v for k, v in value.items()})
    raise InputError(
        f"cannot read generation={value!r}", fix="write generation={'max_length': 256, 'max_batch': 4} (or None)"
    )
