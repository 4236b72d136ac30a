"""Settings reject values of the wrong type with a clear InputError (the fix names the setting), never a raw crash."""

from __future__ import annotations

import numpy as np
import pytest

from converters.errors import InputError
from converters.settings import Settings, Tolerance

BAD = [
    ({"validation_inputs": "3"}, "validation_inputs must be int"),
    ({"validation_inputs": 2.5}, "validation_inputs must be int"),
    ({"seed": None}, "seed must be int"),
    ({"backend": 3}, "backend must be str"),
    ({"backend": "cuda"}, "unknown backend"),
    ({"validate": "yes"}, "validate must be bool"),
    ({"fold_size_threshold": None}, "fold_size_threshold must be int"),
    ({"trt_tf32": 1}, "trt_tf32 must be bool"),
    ({"ort_providers": "CPUExecutionProvider"}, "ort_providers must be tuple"),
    ({"precision": "fp64"}, "unknown precision"),
    ({"tolerances": {"float32": ("a", "b")}}, "must be (atol, rtol)"),
    ({"tolerances": {"float32": (1e-3,)}}, "must be (atol, rtol)"),
    ({"tolerances": {"logits": (-1e-3, 0.0)}}, "finite and >= 0"),
    ({"tolerances": {"logits": (float("nan"), 0.0)}}, "finite and >= 0"),
    ({"tolerances": {"logits": Tolerance(1e-3, -1.0)}}, "finite and >= 0"),
    ({"tolerances": 1e-3}, "tolerances must be a mapping"),
    ({"dynamic": {"x": {0: ("batch", "one", 4, 8)}}}, "whole numbers"),
    ({"dynamic": {"x": {0: ("batch", 1.5, 4, 8)}}}, "whole numbers"),
    ({"dynamic": {"x": {"0": ("batch", 1, 4, 8)}}}, "integer axis"),
    ({"dynamic": {"x": {0: ("batch", 8, 4, 1)}}}, "min <= opt <= max"),
    ({"dynamic": {"x": {0: ("batch", 1, 4)}}}, "(name, min, opt, max)"),
    ({"dynamic": [("x", 0)]}, "cannot read dynamic"),
]


@pytest.mark.parametrize(("kwargs", "cause"), BAD, ids=[str(k) for k, _ in BAD])
def test_bad_setting_is_a_clear_input_error(kwargs: dict, cause: str) -> None:
    with pytest.raises(InputError) as info:
        Settings(**kwargs)
    text = str(info.value)
    assert cause in text
    assert "fix:" in text and text.startswith("[input]")


def test_good_values_of_related_types_are_taken() -> None:
    s = Settings(
        precision_min_share=1,  # an int where a float is declared
        dynamic={"x": {np.int64(0): ("batch", np.int64(1), 4, 8)}},  # numpy integers
        tolerances={"logits": [1e-3, 1e-2]},
    )
    assert s.precision_min_share == 1.0 and isinstance(s.precision_min_share, float)
    assert s.dynamic[0].axis == 0 and s.dynamic[0].min == 1
    assert s.tolerances["logits"] == Tolerance(1e-3, 1e-2)
