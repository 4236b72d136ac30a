"""Built-in converters for pointwise and numeric ATen and prims ops the torch exporter cannot translate.

``register_aten1_converters`` is the one list of what this module adds to the default registry; the orthogonal
polynomials live in :mod:`converters.aten_polynomials`.
"""

from __future__ import annotations

from converters.aten_polynomials import register_polynomial_converters
from converters.aten_special import register_special_converters
from converters.registry import ConverterRegistry


def register_aten1_converters(registry: ConverterRegistry) -> None:
    """Register every pointwise and numeric ATen/prims converter on ``registry``."""
    register_polynomial_converters(registry)
    register_special_converters(registry)
