"""What every test process needs before it imports a model library.

torchvision's wheel registers meta kernels for ``torchvision::nms`` and ``torchvision::qnms`` when imported, and its
C++ library (which defines their schemas) cannot load beside the CPU build of torch: without the schemas, ``import
torchvision`` fails, and so do transformers' image models and timm, which import it. Defining the two schemas first
lets torchvision's models import and run (its detection ops cannot). Subprocesses a test starts import this module
too (``python -c "import tests_environment; ..."`` with ``tests/`` on the path).
"""

from __future__ import annotations

import contextlib

import torch

_SCHEMAS = {
    "nms": "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}


def define_torchvision_schemas() -> None:
    """Define the schemas torchvision's meta registrations expect, once per process (a no-op when they exist)."""
    for name, schema in _SCHEMAS.items():
        # already defined (RuntimeError): by torchvision's own library, or earlier in this process
        with contextlib.suppress(RuntimeError):
            torch.library.define(f"torchvision::{name}", schema)


define_torchvision_schemas()
