"""Top-1 accuracy of a small CNN trained on scikit-learn's digits (1,797 8x8 images, 80/20 split), in PyTorch fp32
and converted to INT8 and FP8 (ONNX Runtime's CPU provider; FP8 through the exact emulation): the accuracy table
of issue 15. INT8 twice: with the default fp16 fallback (as TensorRT runs it, emulated on the CPU) and with the fp32
fallback (ONNX Runtime's integer kernels, the fast CPU module). The model and data are the tests'
(``tests/quantize_support.py``).

    python benchmarks/quantize_digits.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from quantize_support import accuracy, digits, trained_digits_cnn  # noqa: E402

import pipeline  # noqa: E402


def main() -> None:
    """Train, convert both ways, print the table."""
    x_train, y_train, x_test, y_test = digits()
    model = trained_digits_cnn(x_train, y_train)
    calibration = [x_train[i : i + 64] for i in range(0, 512, 64)]
    with torch.no_grad():
        rows = [("fp32 (PyTorch)", accuracy(model(x_test), y_test), "", "")]
    dynamic = {"x": {0: ("batch", 1, 64, 512)}}
    for precision, fallback in (("int8", "fp16"), ("int8", "fp32"), ("fp8", "fp16")):
        module = pipeline.convert(
            model,
            x_test[:64],
            precision=precision,
            quantize_fallback=fallback,
            dynamic=dynamic,
            calibration=calibration,
        )
        report = module.report.quantization
        assert report is not None
        with torch.no_grad():
            top1 = accuracy(module(x_test), y_test)
        name = f"{precision} ({report.method}, {fallback} elsewhere)"
        rows.append((name, top1, f"{report.share:.0%}", f"{report.relative_error:.4f}"))
    base = rows[0][1]
    print(f"| precision | top-1 ({len(y_test)} test images) | vs fp32 (points) | FLOPs in 8 bits | logit error |")
    print("| --- | --- | --- | --- | --- |")
    for name, top1, share, error in rows:
        print(f"| {name} | {top1:.2%} | {100 * (top1 - base):+.2f} | {share} | {error} |")


if __name__ == "__main__":
    main()
