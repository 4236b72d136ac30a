"""The settings of a conversion: one frozen dataclass that every stage reads (see :class:`Settings` for each field).

It is defined in ``converters/settings.py`` because converters and passes read it too and nothing below
``pipeline`` may import ``pipeline``; this is where the pipeline's own modules and users find it.
"""

from converters.setting_choices import (
    BACKENDS,
    CALIBRATION_METHODS,
    CHECK_PARSERS,
    FALLBACKS,
    HARDWARE_COMPATIBILITY,
    ORT_INT8_CONV_OUTPUTS,
    PRECISION_IO,
    PRECISIONS,
    QUANTIZE_FALLBACKS,
)
from converters.settings import COMPUTE_TYPES, DEFAULT_TOLERANCES, FLOAT64_COMPUTED_IN, GROUPS, Settings, Tolerance
from converters.shapes import DynamicDim

__all__ = [
    "BACKENDS",
    "CALIBRATION_METHODS",
    "CHECK_PARSERS",
    "COMPUTE_TYPES",
    "DEFAULT_TOLERANCES",
    "DynamicDim",
    "FALLBACKS",
    "FLOAT64_COMPUTED_IN",
    "GROUPS",
    "HARDWARE_COMPATIBILITY",
    "ORT_INT8_CONV_OUTPUTS",
    "PRECISIONS",
    "PRECISION_IO",
    "QUANTIZE_FALLBACKS",
    "Settings",
    "Tolerance",
]
