"""The translations the exporter's table lacks, which the kept table adds (``missing_translations`` in
pipeline.exporting.translation_table): ``aten.sym_numel`` (Inkling 2's vision tower takes ``numel()`` of a tensor whose
length the data decides, and its export stopped at "No ONNX function found for aten.sym_numel")."""

from __future__ import annotations

import numpy as np
import torch
from torch.onnx._internal.exporter._registration import ONNXRegistry

from pipeline.exporting.translation_table import reused_translation_table


def test_sym_numel_is_in_the_kept_table_as_the_product_of_the_shape() -> None:
    """The table an export takes holds a translation of ``aten.sym_numel`` whose signature the exporter could read,
    and it gives the element count of a tensor of any shape (a scalar's is 1)."""
    with reused_translation_table():
        table = ONNXRegistry.from_torchlib(opset_version=24)
    (translation,) = table.get_decomps(torch.ops.aten.sym_numel.default)
    assert translation.signature is not None, "the exporter could not read the translation's signature"
    for shape in ((3, 4, 2), (5,), (2, 0), ()):
        count = translation.onnx_function(np.zeros(shape, np.float32))
        assert int(np.asarray(count)) == int(np.prod(shape)), shape
