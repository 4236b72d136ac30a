"""``generation=`` (``converters.generation_settings``) on its own: the defaults, every check with the error it gives,
the token ids' normalisation and their check against the vocabulary. No model is converted (the conversions that use
these settings are tests/pipeline/test_hostile_conversions.py and tests/pipeline/generation/)."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest

from converters.errors import InputError
from converters.generation_settings import (
    GenerationSettings,
    check_token_ids,
    normalise_generation,
    token_ids,
)


def exactly(error: pytest.ExceptionInfo[InputError], message: str, fix: str) -> None:
    """The error says exactly ``message`` and ``fix`` (the words are the interface: they say what to change)."""
    assert str(error.value) == f"[input] {message}\n  fix: {fix}"


def says(error: pytest.ExceptionInfo[InputError], *words: str) -> None:
    text = str(error.value)
    assert text.startswith("[input] generation") or text.startswith("[input] unknown generation"), text
    assert "\n  fix: " in text, text
    for word in words:
        assert word in text, (word, text)


def test_the_defaults() -> None:
    settings = GenerationSettings()
    assert (settings.max_length, settings.max_batch, settings.max_prompt) == (256, 4, 256)
    assert settings.eos_token_id == () and settings.pad_token_id is None and settings.layers == 0
    assert settings.attention == "auto" and settings.validation_steps == 8


@pytest.mark.parametrize("attention", ["auto", "onnx", "decomposed"])
def test_the_attention_choices(attention: str) -> None:
    assert GenerationSettings(attention=attention).attention == attention


def test_an_unknown_attention_is_refused() -> None:
    with pytest.raises(InputError) as error:
        GenerationSettings(attention="flash")
    exactly(error, "unknown generation attention 'flash'", "use 'auto', 'onnx' or 'decomposed'")


def test_token_ids_become_tuples_of_python_ints() -> None:
    settings = GenerationSettings(eos_token_id=np.int64(2), pad_token_id=np.int64(0))  # type: ignore[arg-type]
    assert settings.eos_token_id == (2,) and type(settings.eos_token_id[0]) is int
    assert settings.pad_token_id == 0 and type(settings.pad_token_id) is int
    settings = GenerationSettings(eos_token_id=[2, np.int64(7)], pad_token_id=3)  # type: ignore[arg-type]
    assert settings.eos_token_id == (2, 7) and all(type(i) is int for i in settings.eos_token_id)
    assert settings.pad_token_id == 3
    with pytest.raises(InputError) as error:
        GenerationSettings(pad_token_id=[1, 2])  # type: ignore[arg-type]
    exactly(
        error,
        "generation pad_token_id must be an int (token ids), got [1, 2] (list)",
        "write generation={'pad_token_id': 2}",
    )


def test_max_prompt_defaults_to_max_length_and_stays_when_given() -> None:
    assert GenerationSettings(max_length=64).max_prompt == 64
    assert GenerationSettings(max_length=64, max_prompt=16).max_prompt == 16
    assert GenerationSettings(max_length=64, max_prompt=64).max_prompt == 64
    assert GenerationSettings(max_length=2, max_batch=1, max_prompt=1).max_prompt == 1


@pytest.mark.parametrize(
    "given",
    [{"max_length": 64.0}, {"max_batch": True}, {"max_batch": 2.0}, {"max_prompt": 1.5}, {"max_length": "64"}],
)
def test_sizes_must_be_whole_numbers(given: dict[str, Any]) -> None:
    with pytest.raises(InputError) as error:
        GenerationSettings(**given)
    says(error, "generation needs whole numbers, got GenerationSettings(", "generation={'max_length': 256, 'max_batch'")
    assert str(error.value).endswith("\n  fix: write generation={'max_length': 256, 'max_batch': 4}")
    assert GenerationSettings(max_length=np.int32(64), max_batch=np.int64(2)).max_prompt == 64  # type: ignore[arg-type]


@pytest.mark.parametrize("steps", [-1, 1.0, True, None])
def test_validation_steps_must_be_a_whole_number_of_zero_or_more(steps: Any) -> None:
    with pytest.raises(InputError) as error:
        GenerationSettings(validation_steps=steps)
    exactly(
        error,
        f"generation validation_steps must be a whole number >= 0, got {steps!r}",
        "write generation={'validation_steps': 8, ...}",
    )


def test_zero_validation_steps_are_taken() -> None:
    assert GenerationSettings(validation_steps=0).validation_steps == 0


@pytest.mark.parametrize(
    ("given", "values"),
    [
        ({"max_length": 1}, "max_length=1, max_batch=4, max_prompt=1"),
        ({"max_length": 0}, "max_length=0, max_batch=4, max_prompt=0"),
        ({"max_batch": 0}, "max_length=256, max_batch=0, max_prompt=256"),
        ({"max_batch": -2}, "max_length=256, max_batch=-2, max_prompt=256"),
        ({"max_prompt": 0}, "max_length=256, max_batch=4, max_prompt=0"),
        ({"max_length": 8, "max_prompt": 9}, "max_length=8, max_batch=4, max_prompt=9"),
    ],
)
def test_sizes_out_of_range_are_refused_with_the_values(given: dict[str, int], values: str) -> None:
    with pytest.raises(InputError) as error:
        GenerationSettings(**given)
    exactly(
        error,
        "generation needs max_length >= 2, max_batch >= 1 and 1 <= max_prompt <= max_length, got " + values,
        "write generation={'max_length': 256, 'max_batch': 4}",
    )


def test_the_smallest_sizes_are_taken() -> None:
    settings = GenerationSettings(max_length=2, max_batch=1)
    assert (settings.max_length, settings.max_batch, settings.max_prompt) == (2, 1, 2)


def test_token_ids_of_every_accepted_form() -> None:
    assert token_ids("eos_token_id", 2) == (2,)
    assert token_ids("eos_token_id", 0) == (0,)
    assert token_ids("eos_token_id", [2, 7]) == (2, 7)
    assert token_ids("eos_token_id", (np.int64(5),)) == (5,)
    assert token_ids("eos_token_id", []) == ()
    assert token_ids("pad_token_id", np.uint8(3), single=True) == (3,)


@pytest.mark.parametrize(
    ("value", "got"),
    [
        ("2", "got '2' (str)"),
        (b"\x02", "got b'\\x02' (bytes)"),
        (True, "got True (bool)"),
        (2.0, "got 2.0 (float)"),
        ([2, 7.0], "got [2, 7.0] (list)"),
        ([[2]], "got [[2]] (list)"),
        (None, "got None (NoneType)"),
    ],
)
def test_token_ids_of_other_types_are_refused_naming_the_value_and_its_type(value: Any, got: str) -> None:
    with pytest.raises(InputError) as error:
        token_ids("eos_token_id", value)
    exactly(
        error,
        f"generation eos_token_id must be an int or a sequence of ints (token ids), {got}",
        "write generation={'eos_token_id': 2} (or 'eos_token_id': [2, 7] for several)",
    )


def test_a_single_token_id_refuses_a_sequence_and_its_fix_offers_no_list() -> None:
    with pytest.raises(InputError) as error:
        token_ids("pad_token_id", (1,), single=True)
    says(error, "generation pad_token_id must be an int (token ids), got (1,) (tuple)")
    assert str(error.value).endswith("fix: write generation={'pad_token_id': 2}")


def test_negative_token_ids_are_refused() -> None:
    with pytest.raises(InputError) as error:
        token_ids("eos_token_id", [3, -1, -2])
    exactly(
        error,
        "generation eos_token_id [-1, -2] is outside the vocabulary: token ids are >= 0",
        "pass the eos_token_id of the model's tokenizer (tokenizer.eos_token_id)",
    )
    with pytest.raises(InputError, match=r"pad_token_id \[-1\] is outside"):
        GenerationSettings(pad_token_id=-1)


def test_ids_within_the_vocabulary_or_an_unknown_one_leave_the_settings_as_they_are() -> None:
    settings = GenerationSettings(eos_token_id=(0, 99), pad_token_id=99)
    assert check_token_ids(settings, 100) is settings
    assert check_token_ids(settings, 0) is settings  # 0: the width is unknown, nothing checked
    huge = GenerationSettings(eos_token_id=10**6)
    assert check_token_ids(huge, 0) is huge
    assert check_token_ids(GenerationSettings(), 1) == GenerationSettings()


@pytest.mark.parametrize(
    ("given", "listed"),
    [
        ({"eos_token_id": 100}, "generation eos_token_id=100 outside"),
        ({"eos_token_id": [5, 100, 101]}, "generation eos_token_id=100, eos_token_id=101 outside"),
        ({"pad_token_id": 100}, "generation pad_token_id=100 outside"),
        ({"eos_token_id": 100, "pad_token_id": 200}, "generation eos_token_id=100, pad_token_id=200 outside"),
    ],
)
def test_given_ids_outside_the_vocabulary_are_refused(given: dict[str, Any], listed: str) -> None:
    with pytest.raises(InputError) as error:
        check_token_ids(GenerationSettings(**given), 100)
    exactly(
        error,
        f"{listed} the model's vocabulary [0, 100) (the width of its logits): an eos the model can never produce, "
        "a pad it cannot embed",
        "pass the ids of the model's own tokenizer: generation={'eos_token_id': tokenizer.eos_token_id, "
        "'pad_token_id': tokenizer.pad_token_id}",
    )


def test_ids_from_the_models_config_outside_the_vocabulary_are_dropped_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = GenerationSettings(eos_token_id=(3, 100), pad_token_id=99)
    with caplog.at_level(logging.WARNING, logger="converters.generation_settings"):
        checked = check_token_ids(settings, 100, from_model=("eos_token_id", "pad_token_id"))
    assert checked.eos_token_id == (3,) and checked.pad_token_id == 99
    assert checked.max_length == settings.max_length
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert record.getMessage() == (
        "generation: eos_token_id=100 from the model's generation_config outside its vocabulary [0, 100) (the width "
        "of its logits): dropped (an eos it cannot produce, a pad it cannot embed); pass generation={'eos_token_id': "
        "..., 'pad_token_id': ...} to choose others"
    )

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="converters.generation_settings"):
        checked = check_token_ids(GenerationSettings(eos_token_id=2, pad_token_id=100), 100, ("pad_token_id",))
    assert checked.eos_token_id == (2,) and checked.pad_token_id is None
    assert "pad_token_id=100 from the model's generation_config" in caplog.text


def test_a_given_id_is_refused_even_where_the_models_are_dropped() -> None:
    settings = GenerationSettings(eos_token_id=100, pad_token_id=100)
    with pytest.raises(InputError) as error:
        check_token_ids(settings, 100, from_model=("eos_token_id",))
    says(error, "generation pad_token_id=100 outside")
    assert "eos_token_id=100" not in str(error.value)


def test_generation_as_given() -> None:
    assert normalise_generation(None) is None
    settings = GenerationSettings(max_length=32)
    assert normalise_generation(settings) is settings
    assert normalise_generation({"max_length": 32, "max_batch": 2}) == GenerationSettings(max_length=32, max_batch=2)
    assert normalise_generation({}) == GenerationSettings()


def test_unknown_generation_settings_are_named_with_the_known_ones() -> None:
    with pytest.raises(InputError) as error:
        normalise_generation({"max_len": 32, "beams": 2, "max_batch": 1})
    known = (
        "attention, decoder_start_token_id, eos_token_id, fixed_inputs, kept_window, kind, layers, max_batch, "
        "max_length, max_prompt, model_options, pad_token_id, prompt_continues, prompt_tokens, validation_steps"
    )
    exactly(error, "unknown generation setting(s) beams, max_len", f"known generation settings are: {known}")


@pytest.mark.parametrize("value", [256, "max_length=256", [("max_length", 256)]])
def test_generation_of_another_type_is_refused(value: Any) -> None:
    with pytest.raises(InputError) as error:
        normalise_generation(value)
    exactly(
        error, f"cannot read generation={value!r}", "write generation={'max_length': 256, 'max_batch': 4} (or None)"
    )


def test_each_token_id_setting_is_named_in_its_error() -> None:
    with pytest.raises(InputError) as error:
        GenerationSettings(eos_token_id=-1)
    exactly(
        error,
        "generation eos_token_id [-1] is outside the vocabulary: token ids are >= 0",
        "pass the eos_token_id of the model's tokenizer (tokenizer.eos_token_id)",
    )
    with pytest.raises(InputError) as error:
        GenerationSettings(eos_token_id="2")  # type: ignore[arg-type]
    assert str(error.value).startswith("[input] generation eos_token_id must be an int or a sequence of ints")


def test_a_vocabulary_of_one_token_is_checked_too() -> None:
    assert check_token_ids(GenerationSettings(eos_token_id=0), 1).eos_token_id == (0,)
    with pytest.raises(InputError, match=r"eos_token_id=1 outside the model's vocabulary \[0, 1\)"):
        check_token_ids(GenerationSettings(eos_token_id=1), 1)


def test_several_dropped_ids_are_listed_and_token_zero_is_kept(caplog: pytest.LogCaptureFixture) -> None:
    settings = GenerationSettings(eos_token_id=(0, 100, 7), pad_token_id=100)
    with caplog.at_level(logging.WARNING, logger="converters.generation_settings"):
        checked = check_token_ids(settings, 100, from_model=("eos_token_id", "pad_token_id"))
    assert checked.eos_token_id == (0, 7) and checked.pad_token_id is None
    assert "generation: eos_token_id=100, pad_token_id=100 from the model's generation_config" in caplog.text
