"""INT8 against fp32 on ONNX Runtime's CPU provider: median latency of the converted modules and artifact size.

Models (nothing downloaded): ``cnn``, the bundled ``examples/cnn.py`` SmallResNet with random weights on a
16x3x64x64 batch (Conv-heavy); ``digits-resnet``, the same network with one input channel trained on scikit-learn's
digits resized to 32x32, on 64 test images (the model of ``benchmarks/quantize_digits.py``'s accuracy table); and
``bert``, a 4-layer BERT (hidden 256, intermediate 1024) with random weights on 8x128 tokens (MatMul-heavy).
Each is converted four ways: fp32; ``precision="int8", quantize_fallback="fp32"`` (ONNX Runtime fuses
``DQ -> Conv -> Q`` into QLinearConv and ``DQ -> MatMul`` into MatMulIntegerToFloat; the column "integer kernels"
counts them in ONNX Runtime's optimized graph); the same with ``ort_int8_conv_outputs="exact"`` (the convolutions
before residual Adds keep TensorRT's float output instead of the session's own calibrated INT8 one); and
``precision="int8"`` with the default fp16 fallback (on the CPU its fp16 part runs as the float32 emulation with a
rounding per tensor: slower by design, shown for completeness).
The column "FLOPs in 8 bits" is the quantized share of MatMul/Gemm/Conv FLOPs (``report.quantization.share``).
Runners are called in turn each round, so a busy machine slows all alike; the table gives medians of the wall time
and of the process's CPU time (all threads; on a shared machine the wall time also holds the waits for a core).
Every variant runs with the same ONNX Runtime thread settings: ``--threads`` intra-op threads, and their spin-waiting
off unless ``--spinning`` (``ort_allow_spinning``): on a machine shared with other work, spinning threads compete for
the cores and the wall times measure the scheduler (measured here, 2 busy cores: 48 ms a call with spinning, 8 ms
without, for the same fp32 session).

The INT8 session graph is ONNX Runtime's own (:mod:`pipeline.runtime.ort.int8`): ``module.onnx`` keeps TensorRT's
placement. Its convolutions run as QLinearConv, the residual Adds as QLinearAdd (by default the convolution before
the Add gets a calibrated INT8 output; with "exact" it runs as im2col and MatMulIntegerToFloat, or in float below 32
channels); the few-channel stem stays float.

    python benchmarks/bench_quantize.py                # 50 rounds per model
    python benchmarks/bench_quantize.py --rounds 10 --models cnn --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx
import onnxruntime as ort
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

import pipeline  # noqa: E402

VARIANTS: dict[str, dict[str, Any]] = {
    "fp32": {},
    "int8 (fp32 elsewhere)": {"precision": "int8", "quantize_fallback": "fp32"},
    "int8 (fp32 elsewhere, exact conv outputs)": {
        "precision": "int8",
        "quantize_fallback": "fp32",
        "ort_int8_conv_outputs": "exact",
    },
    "int8 (fp16 elsewhere, emulated)": {"precision": "int8"},
}


def cnn() -> tuple[torch.nn.Module, Any, list[Any]]:
    """The bundled SmallResNet, a 16x3x64x64 sample and four calibration batches."""
    import cnn as example

    model, _ = example.build()
    sample = torch.randn(16, 3, 64, 64)
    return model.eval(), sample, [torch.randn(16, 3, 64, 64) for _ in range(4)]


def bert() -> tuple[torch.nn.Module, Any, list[Any]]:
    """A 4-layer BERT, an 8x128 token sample and four calibration samples."""
    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(
        num_hidden_layers=4, hidden_size=256, num_attention_heads=4, intermediate_size=1024, vocab_size=1000
    )
    model = transformers.BertModel(config).eval()

    def draw(seed: int) -> Any:
        """One (args, kwargs) sample of random token ids."""
        ids = torch.randint(0, 1000, (8, 128), generator=torch.Generator().manual_seed(seed))
        return ((), {"input_ids": ids, "attention_mask": torch.ones(8, 128, dtype=torch.long)})

    return model, draw(0), [draw(s) for s in range(1, 5)]


def digits_resnet() -> tuple[torch.nn.Module, Any, list[Any]]:
    """The SmallResNet trained on scikit-learn's digits resized to 32x32 (``tests/quantize_support.py``; the model of
    ``benchmarks/quantize_digits.py``'s accuracy table), 64 test images, four batches of training images."""
    sys.path.insert(0, str(ROOT / "tests"))
    from quantize_support import digits, trained_digits_resnet, upsampled

    x_train, y_train, x_test, _ = digits()
    x_train = upsampled(x_train)
    model = trained_digits_resnet(x_train, y_train)
    return model, upsampled(x_test[:64]), [x_train[i : i + 64] for i in range(0, 256, 64)]


MODELS: dict[str, Callable[[], tuple[torch.nn.Module, Any, list[Any]]]] = {
    "cnn": cnn,
    "digits-resnet": digits_resnet,
    "bert": bert,
}


def call(module: Callable[..., Any], sample: Any) -> Any:
    """Call ``module`` on a tensor or an (args, kwargs) sample."""
    if isinstance(sample, tuple) and len(sample) == 2 and isinstance(sample[1], dict):
        return module(*sample[0], **sample[1])
    return module(sample)


INTEGER_KERNELS = (
    "QLinearConv",
    "QLinearMatMul",
    "MatMulIntegerToFloat",
    "QGemm",
    "QLinearAdd",
    "DynamicQuantizeMatMul",
)


def integer_kernels(module: pipeline.ConvertedModule, directory: Path) -> str:
    """The integer kernels ONNX Runtime's CPU provider fuses the module's graph into, counted by op, and the
    convolutions left in float."""
    from pipeline.runtime.ort.int8 import disabled_optimizers
    from pipeline.runtime.ort.session_graph import runnable_model

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(directory / "optimized.onnx")
    runnable = runnable_model(module.onnx, "onnxruntime", module.settings)
    ort.InferenceSession(
        runnable.SerializeToString(),
        options,
        providers=["CPUExecutionProvider"],
        disabled_optimizers=disabled_optimizers(runnable),  # as the backend makes its session
    )
    ops = [n.op_type for n in onnx.load(options.optimized_model_filepath).graph.node]
    found = [f"{ops.count(k)} {k}" for k in INTEGER_KERNELS if ops.count(k)]
    floats = ops.count("Conv") + ops.count("FusedConv")
    if found and floats:
        found.append(f"{floats} float Conv")
    return ", ".join(found) or "none"


def measure(name: str, rounds: int, threads: int, spinning: bool) -> dict[str, Any]:
    """Convert ``name`` every way of :data:`VARIANTS`; median latency and artifact size of each."""
    model, sample, calibration = MODELS[name]()
    modules, sizes, kernels, shares = {}, {}, {}, {}
    with tempfile.TemporaryDirectory() as directory:
        for label, settings in VARIANTS.items():
            module = pipeline.convert(
                model,
                sample,
                calibration=calibration,
                ort_intra_op_threads=threads,
                ort_allow_spinning=spinning,
                validate=False,
                **settings,
            )
            path = module.save(Path(directory) / f"{name}-{len(modules)}.ptrt")
            sizes[label] = sum(p.stat().st_size for p in ([path] if path.is_file() else path.rglob("*")))
            quantization = module.report.quantization
            shares[label] = "" if quantization is None else f"{quantization.share:.0%}"
            kernels[label] = integer_kernels(module, Path(directory))
            modules[label] = module
    times: dict[str, list[float]] = {label: [] for label in modules}
    cpu: dict[str, list[float]] = {label: [] for label in modules}
    with torch.inference_mode():
        for module in modules.values():
            for _ in range(3):
                call(module, sample)
        for _ in range(rounds):
            for label, module in modules.items():
                start, used = time.perf_counter(), time.process_time()
                call(module, sample)
                times[label].append(time.perf_counter() - start)
                cpu[label].append(time.process_time() - used)
    return {
        label: {
            "median_ms": 1e3 * statistics.median(times[label]),
            "median_cpu_ms": 1e3 * statistics.median(cpu[label]),
            "artifact_bytes": sizes[label],
            "quantized_share": shares[label],
            "integer_kernels": kernels[label],
        }
        for label in modules
    }


def main() -> None:
    """Run the benchmark and print the table (and write JSON with ``--json``)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--spinning", action="store_true", help="let ONNX Runtime's threads spin-wait (its default)")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = {name: measure(name, args.rounds, args.threads, args.spinning) for name in args.models}
    print(
        f"| model | variant | median latency (ms) | vs fp32 | median CPU time (ms) | vs fp32 | artifact (MB) | "
        f"FLOPs in 8 bits | integer kernels |  ({args.rounds} rounds, {args.threads} threads, spinning "
        f"{'on' if args.spinning else 'off'})"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, variants in results.items():
        base, base_cpu = variants["fp32"]["median_ms"], variants["fp32"]["median_cpu_ms"]
        for label, row in variants.items():
            print(
                f"| {name} | {label} | {row['median_ms']:.2f} | {base / row['median_ms']:.2f}x | "
                f"{row['median_cpu_ms']:.2f} | {base_cpu / row['median_cpu_ms']:.2f}x | "
                f"{row['artifact_bytes'] / 1e6:.2f} | {row['quantized_share']} | {row['integer_kernels']} |"
            )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
