"""Built-in converters for ATen ops outside pointwise math that the exporter has no ONNX translation for.

``register_aten2_converters`` is the one list of them (linear algebra lives in ``converters/aten_linalg.py``).
"""

from __future__ import annotations

from converters.aten_linalg import register_linalg_converters
from converters.aten_lu import register_lu_converters
from converters.registry import ConverterRegistry


def register_aten2_converters(registry: ConverterRegistry) -> None:
    """Register every converter of this module and of ``converters/aten_linalg.py`` on ``registry``."""
    register_linalg_converters(registry)
    register_lu_converters(registry)
