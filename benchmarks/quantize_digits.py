"""Top-1 accuracy of two models trained on scikit-learn's digits (1,797 8x8 images, 80/20 split), in PyTorch fp32
and converted to INT8 and FP8 on ONNX Runtime's CPU provider (FP8 through the exact emulation): the accuracy table
of issue 15. The models and data are the tests' (``tests/quantize_support.py``):

* ``cnn``: two convolutions, pooling and a linear head on the 8x8 images. INT8 twice: with the default fp16 fallback
  (as TensorRT runs it, emulated on the CPU) and with the fp32 fallback (ONNX Runtime's integer kernels).
* ``resnet``: the bundled SmallResNet (three residual blocks) on the images resized to 32x32, INT8 with the fp32
  fallback: the default session (the convolutions before residual Adds requantized, ``ort_int8_conv_outputs=
  "requantize"``), the exact one, and the former default calibration (``entropy``), whose clipping of the residual
  path the accuracy search can only undo by leaving convolutions in float.

    python benchmarks/quantize_digits.py
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from quantize_support import accuracy, digits_task  # noqa: E402

import pipeline  # noqa: E402

VARIANTS: dict[str, list[dict[str, Any]]] = {
    "cnn": [
        {"precision": "int8"},
        {"precision": "int8", "quantize_fallback": "fp32"},
        {"precision": "fp8"},
    ],
    "resnet": [
        {"precision": "int8", "quantize_fallback": "fp32"},
        {"precision": "int8", "quantize_fallback": "fp32", "ort_int8_conv_outputs": "exact"},
        {"precision": "int8", "quantize_fallback": "fp32", "calibration_method": "entropy"},
        {"precision": "fp8", "quantize_fallback": "fp32"},
    ],
}


def main() -> None:
    """Train both models, convert each every way of :data:`VARIANTS`, print the table."""
    print("| model | precision | top-1 (360 test images) | vs fp32 (points) | FLOPs in 8 bits | logit error |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, variants in VARIANTS.items():
        model, test, y_test, calibration, base = digits_task(resnet=name == "resnet")
        print(f"| {name} | fp32 (PyTorch) | {base:.2%} | +0.00 | | |")
        for settings in variants:
            module = pipeline.convert(
                model,
                test[:64],
                dynamic={"x": {0: ("batch", 1, 64, 512)}},
                calibration=calibration,
                **settings,
            )
            report = module.report.quantization
            assert report is not None
            with torch.no_grad():
                top1 = accuracy(module(test), y_test)
            label = f"{settings['precision']} ({report.method}, {report.fallback} elsewhere"
            if "ort_int8_conv_outputs" in settings:
                label += f", {settings['ort_int8_conv_outputs']} conv outputs"
            print(
                f"| {name} | {label}) | {top1:.2%} | {100 * (top1 - base):+.2f} | {report.share:.0%} | "
                f"{report.relative_error:.4f} |"
            )


if __name__ == "__main__":
    main()
