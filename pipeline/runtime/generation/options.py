"""The keyword options of ``generate()`` and ``stream()``: which they take, a transformers ``GenerationConfig`` merged
under them, and the checks that do not need the model.

An option neither takes is an :class:`InputError` naming those it takes (transformers users pass many). A
``generation_config=`` gives the options of the same names (the keyword arguments win, as in transformers); a field
of it set to a value other than transformers' default that we do not take is an :class:`InputError` naming it, rather
than a setting silently ignored. transformers is not imported here: the config is read through ``to_dict()``.
"""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass
from typing import Any

from converters.errors import InputError


@dataclass(frozen=True)
class GenerateOptions:
    """What one ``generate``/``stream`` call asked for (the names and meanings of transformers' ``generate``)."""

    max_new_tokens: int | None = None
    max_length: int | None = None
    min_new_tokens: int | None = None
    min_length: int | None = None
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float | None = None
    no_repeat_ngram_size: int | None = None
    bad_words_ids: tuple[tuple[int, ...], ...] | None = None
    eos_token_id: int | list[int] | tuple[int, ...] | None = None
    pad_token_id: int | None = None
    seed: int | None = None
    num_return_sequences: int = 1
    forced_bos_token_id: int | None = None
    forced_eos_token_id: int | list[int] | tuple[int, ...] | None = None
    suppress_tokens: tuple[int, ...] | None = None
    begin_suppress_tokens: tuple[int, ...] | None = None
    logits_processor: Any = None
    stopping_criteria: Any = None
    # generate() only
    streamer: Any = None
    num_beams: int = 1
    length_penalty: float = 1.0
    early_stopping: bool | str = False
    output_scores: bool = False
    output_logits: bool = False
    return_dict_in_generate: bool = False

    @property
    def expand(self) -> int:
        """Rows per prompt: the beams, or the sequences drawn for each prompt (transformers' expand size)."""
        return max(self.num_beams, self.num_return_sequences)


#: The options only ``generate()`` takes: beams and transformers' output objects need the whole decoding at once.
GENERATE_ONLY = (
    "streamer",
    "num_beams",
    "length_penalty",
    "early_stopping",
    "output_scores",
    "output_logits",
    "return_dict_in_generate",
)
_FIELDS = tuple(f.name for f in dataclasses.fields(GenerateOptions))
TAKEN = {
    "generate": (*_FIELDS, "generation_config"),
    "stream": (*(name for name in _FIELDS if name not in GENERATE_ONLY), "generation_config"),
}

#: transformers' global defaults (``GenerationConfig._get_default_generation_params``) of the fields we read: a
#: config field at its default is not a setting.
_TRANSFORMERS_DEFAULTS: dict[str, Any] = {
    "max_length": 20, "min_length": 0, "do_sample": False, "use_cache": True, "early_stopping": False,
    "num_beams": 1, "temperature": 1.0, "top_k": 50, "top_p": 1.0, "typical_p": 1.0, "repetition_penalty": 1.0,
    "length_penalty": 1.0, "no_repeat_ngram_size": 0, "encoder_no_repeat_ngram_size": 0, "num_return_sequences": 1,
    "output_scores": False, "return_dict_in_generate": False, "remove_invalid_values": False, "epsilon_cutoff": 0.0,
    "eta_cutoff": 0.0, "encoder_repetition_penalty": 1.0, "num_beam_groups": 1, "diversity_penalty": 0.0,
    "num_assistant_tokens": 20, "num_assistant_tokens_schedule": "constant", "assistant_confidence_threshold": 0.4,
    "assistant_lookbehind": 10, "target_lookbehind": 10,
}  # fmt: skip
#: Config fields that change nothing in a decoder-only decoding over our own cache (a model's generation config
#: carries them: ``model.generation_config`` must be accepted as it is).
_NO_EFFECT = frozenset({"bos_token_id", "decoder_start_token_id", "use_cache", "cache_implementation", "cache_config"})
#: Options that are objects or ours alone: a config has no such fields.
_NOT_OPTIONS = frozenset({"streamer", "logits_processor", "stopping_criteria", "seed"})


def generate_options(method: str, given: dict[str, Any], defaults: tuple[tuple[str, Any], ...] = ()) -> GenerateOptions:
    """The options of one ``method`` (``"generate"`` or ``"stream"``) call, from its keyword arguments over a
    ``generation_config=`` given over ``defaults`` (the model's: :func:`model_defaults`), transformers' order; of the
    model's defaults, ``stream`` takes those it has (no beams).

    >>> generate_options("stream", {"max_new_tokens": 8}).max_new_tokens
    8
    """
    unknown = sorted(set(given) - set(TAKEN[method]))
    if unknown:
        raise _not_taken(method, unknown, "option")
    values = dict(given)
    config = values.pop("generation_config", None)
    if config is not None:
        values = {**config_options(config, method), **values}
    asked = set(values)
    model = {name: value for name, value in defaults if name in TAKEN[method] and name not in asked}
    values = {**model, **values}
    if values.get("do_sample") and values.get("num_beams", 1) > 1 and {"do_sample", "num_beams"} & set(model):
        # transformers would sample beams: a setting of the model's own meets the call's, said as such
        said = " and ".join(f"{n}={values[n]!r}" for n in ("do_sample", "num_beams") if n in model)
        raise InputError(
            f"beam sampling (do_sample=True with num_beams > 1; {said} from the model's generation config) is not "
            "taken",
            fix="pass do_sample=False for beam search, or num_beams=1 for sampling",
        )
    for name in ("bad_words_ids",):
        if values.get(name) is not None:
            values[name] = _token_lists(name, values[name])
    for name in ("suppress_tokens", "begin_suppress_tokens"):
        if values.get(name) is not None:
            values[name] = _token_lists(name, [values[name]])[0] if len(values[name]) else ()
    options = GenerateOptions(**values)
    _check(options)
    return options


def config_options(config: Any, method: str) -> dict[str, Any]:
    """The options a transformers ``GenerationConfig`` sets (its fields that are not None: a field set to
    transformers' default goes over the model's own, as in transformers); a field we do not take is refused when it
    is away from transformers' default."""
    if not hasattr(config, "to_dict"):
        raise InputError(
            f"generation_config must be a transformers GenerationConfig, got {type(config).__name__}",
            fix="pass model.generation_config or transformers.GenerationConfig(...), or the options themselves",
        )
    taken = set(TAKEN[method]) - _NOT_OPTIONS
    options: dict[str, Any] = {}
    refused = []
    for name, value in _fields(config):
        if value is None:
            continue
        if name in taken:
            options[name] = value
        elif not is_default(name, value):
            refused.append(name)
    if refused:
        raise _not_taken(method, sorted(refused), "generation_config field")
    return options


#: transformers' generation-config fields that change the tokens and that ``generate`` does not take: a model whose
#: config sets one is told at conversion that its module decodes without it (``model.generate`` applies it).
NOT_TAKEN_DECODING = frozenset(
    {
        "constraints", "diversity_penalty", "dola_layers", "encoder_no_repeat_ngram_size", "encoder_repetition_penalty",
        "epsilon_cutoff", "eta_cutoff", "exponential_decay_length_penalty", "force_words_ids", "guidance_scale",
        "max_time", "min_p", "num_beam_groups", "penalty_alpha", "remove_invalid_values", "renormalize_logits",
        "sequence_bias", "stop_strings", "token_healing", "top_h", "typical_p", "watermarking_config",
    }
)  # fmt: skip
#: A model's generation-config fields that are the module's own settings (its eos and pad), not a call's defaults.
_SETTINGS = frozenset({"eos_token_id", "pad_token_id"})


def model_defaults(config: Any, capacity: int) -> tuple[dict[str, Any], list[str]]:
    """The defaults a model's generation ``config`` gives ``generate`` (its fields away from transformers' defaults
    that we take: forced and suppressed tokens, sampling, beams, n-gram rules, ...), as ``model.generate`` applies
    them under a call's options, and the fields it sets away from the defaults that we do not take. A
    ``max_new_tokens`` beyond the step's ``capacity`` becomes ``max_length=capacity``, as does a ``max_length``
    beyond it when no ``max_new_tokens`` is set."""
    taken = set(TAKEN["generate"]) - _NOT_OPTIONS - {"generation_config"}
    defaults: dict[str, Any] = {}
    others: list[str] = []
    for name, value in sorted(_fields(config)):
        if name in _SETTINGS or is_default(name, value):
            continue
        if name in taken:
            defaults[name] = value
        else:
            others.append(name)
    if defaults.get("max_new_tokens", 0) >= capacity:
        defaults.pop("max_new_tokens")
        defaults["max_length"] = capacity
    elif "max_new_tokens" in defaults:
        defaults.pop("max_length", None)  # max_new_tokens goes first in transformers: the length is not read
    elif defaults.get("max_length", 0) > capacity:
        defaults["max_length"] = capacity
    return defaults, others


def _fields(config: Any) -> list[tuple[str, Any]]:
    """A generation config's fields that can be options: not private, not its version, not one without effect here."""
    return [
        (name, value)
        for name, value in config.to_dict().items()
        if not name.startswith("_") and name != "transformers_version" and name not in _NO_EFFECT
    ]


def is_default(name: str, value: Any) -> bool:
    """Whether a generation config's field ``name`` holds transformers' default (or no value): not a setting."""
    if value is None or value is False:
        return True
    return name in _TRANSFORMERS_DEFAULTS and value == _TRANSFORMERS_DEFAULTS[name]


def _not_taken(method: str, names: list[str], what: str) -> InputError:
    plural = "s" if len(names) > 1 else ""
    only_generate = [name for name in names if name in GENERATE_ONLY]
    if method == "stream" and only_generate:
        fix = f"call generate() for {', '.join(only_generate)} (stream() yields one token per row at each step)"
    elif what == "option":
        fix = "pass only the options listed (the names of transformers' generate)"
    else:
        fix = "set those fields to their defaults (or None) in the config, or leave generation_config out"
    return InputError(
        f"{method}() does not take the {what}{plural} {', '.join(names)}; it takes: {', '.join(TAKEN[method])}",
        fix=fix,
    )


def _token_lists(name: str, value: Any) -> tuple[tuple[int, ...], ...]:
    """``[[ids], ...]``: a non-empty list of non-empty lists of token ids >= 0."""
    ok = isinstance(value, list | tuple) and len(value) > 0
    ok = ok and all(isinstance(word, list | tuple) and len(word) > 0 for word in value)
    ok = ok and all(_is_int(token) and token >= 0 for word in value for token in word)
    if not ok:
        raise InputError(
            f"{name} must be a non-empty list of non-empty lists of token ids >= 0, got {value!r}",
            fix=f"pass e.g. {name}=[[17], [5, 9]] (tokenizer(words, add_special_tokens=False).input_ids)",
        )
    return tuple(tuple(int(token) for token in word) for word in value)


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check(options: GenerateOptions) -> None:
    """The checks that need no model (sizes against the model's capacity are the module's)."""
    forced = [options.forced_bos_token_id]
    forced += (
        list(options.forced_eos_token_id)
        if isinstance(options.forced_eos_token_id, list | tuple)
        else [options.forced_eos_token_id]
    )
    if any(token is not None and (not _is_int(token) or token < 0) for token in forced):
        raise InputError(
            f"forced_bos_token_id/forced_eos_token_id must be token ids >= 0, got {options.forced_bos_token_id!r}, "
            f"{options.forced_eos_token_id!r}",
            fix="pass the tokenizer's ids, or leave them out",
        )
    for name in ("min_new_tokens", "min_length", "no_repeat_ngram_size", "top_k"):
        value = getattr(options, name)
        if value is not None and (not _is_int(value) or value < 0):
            raise InputError(f"{name} must be an int >= 0, got {value!r}", fix=f"pass e.g. {name}=2, or leave it out")
    for name in ("num_beams", "num_return_sequences"):
        value = getattr(options, name)
        if not _is_int(value) or value < 1:
            raise InputError(
                f"{name} must be a positive int, got {value!r}", fix=f"pass e.g. {name}=4, or leave it out"
            )
    if options.early_stopping not in (True, False, "never"):
        raise InputError(
            f"early_stopping must be True, False or 'never', got {options.early_stopping!r}",
            fix="pass early_stopping=True (stop when num_beams sequences are done), as transformers",
        )
    if isinstance(options.length_penalty, bool) or not isinstance(options.length_penalty, int | float):
        raise InputError(f"length_penalty must be a number, got {options.length_penalty!r}", fix="pass e.g. 1.0")
    if options.num_beams > 1 and options.do_sample:
        raise InputError(
            "beam sampling (num_beams > 1 with do_sample=True) is not taken", fix="pass do_sample=False with num_beams"
        )
    if options.num_beams > 1 and options.streamer is not None:
        raise InputError(
            "a streamer cannot follow beam search (transformers refuses it too): the beams are ordered at the end",
            fix="leave streamer out with num_beams > 1, or decode with num_beams=1",
        )
    if options.num_return_sequences > options.num_beams and not (options.num_beams == 1 and options.do_sample):
        raise InputError(
            f"num_return_sequences={options.num_return_sequences} needs as many beams (num_beams="
            f"{options.num_beams}), or sampling",
            fix=f"pass num_beams >= {options.num_return_sequences}, or do_sample=True",
        )
