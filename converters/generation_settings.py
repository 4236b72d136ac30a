"""``generation=``: the settings group that converts a causal language model as one cached decoder step.

Part of :class:`converters.settings.Settings` (which re-exports :class:`GenerationSettings`); its own module so that
the settings object stays readable.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from converters.errors import InputError


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
    logits validation judges after each prompt's prefill (against transformers' own cached ``generate``)."""

    max_length: int = 256
    max_batch: int = 4
    max_prompt: int | None = None
    eos_token_id: tuple[int, ...] = ()
    pad_token_id: int | None = None
    layers: int = 0
    attention: str = "auto"
    validation_steps: int = 8

    def __post_init__(self) -> None:
        if self.attention not in ("auto", "onnx", "decomposed"):
            raise InputError(
                f"unknown generation attention {self.attention!r}", fix="use 'auto', 'onnx' or 'decomposed'"
            )
        eos = self.eos_token_id
        object.__setattr__(self, "eos_token_id", (eos,) if isinstance(eos, int) else tuple(int(e) for e in eos))
        prompt = self.max_length if self.max_prompt is None else self.max_prompt
        if not (isinstance(self.max_length, int) and isinstance(self.max_batch, int) and isinstance(prompt, int)):
            raise InputError(
                f"generation needs whole numbers, got {self}",
                fix="write generation={'max_length': 256, 'max_batch': 4}",
            )
        if not isinstance(self.validation_steps, int) or self.validation_steps < 0:
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
