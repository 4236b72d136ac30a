"""Run the pass properties of ``tests/passes/test_pass_properties.py`` on many random graphs (default 5,000 each).

    python benchmarks/fuzz_passes.py [--examples 5000] [--seed 0] [--out fuzz-out]

Each property (fp32 passes exact; fp16 and bf16 rewrites valid and near fp32; the real TensorRT-RTX builder builds
the result when it built the input) runs on its own stream of graphs. A failure is shrunk by hypothesis to a
minimal graph, printed, and saved as ``OUT/<property>.onnx``; the exit code is the number of failing properties.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "passes")]

import onnx  # noqa: E402
from hypothesis import HealthCheck, given, seed, settings  # noqa: E402
from random_graphs import random_graph  # noqa: E402
from test_pass_properties import check_fp32, check_low, rtx_build_error, run_passes  # noqa: E402


def check_rtx(model: onnx.ModelProto) -> None:
    """The builder property: it builds the passes' fp32 and fp16 results whenever it built the input."""
    if rtx_build_error(model) is not None:
        return
    for precision in ("fp32", "fp16", "bf16"):
        error = rtx_build_error(run_passes(model, precision))
        assert error is None, f"{precision}: {error}"


PROPERTIES: dict[str, tuple[Callable[[onnx.ModelProto], None], int]] = {
    "fp32_exact": (check_fp32, 12),
    "fp16_near": (lambda m: check_low(m, "fp16"), 8),
    "bf16_near": (lambda m: check_low(m, "bf16"), 8),
    "rtx_builds": (check_rtx, 8),
}


def fuzz(name: str, examples: int, start: int, out: Path) -> bool:
    """Run one property on ``examples`` graphs; True when none failed."""
    check, max_ops = PROPERTIES[name]
    last: list[onnx.ModelProto] = []

    @seed(start)
    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(random_graph(max_ops=max_ops))
    def run(model: onnx.ModelProto) -> None:
        last[:] = [model]  # hypothesis replays the shrunk example last
        check(model)

    began = time.perf_counter()
    try:
        run()
    except Exception as exc:  # noqa: BLE001 - a failing property, reported with its shrunk graph
        out.mkdir(parents=True, exist_ok=True)
        onnx.save(last[0], out / f"{name}.onnx")
        print(f"{name}: FAILED after shrinking ({time.perf_counter() - began:.0f} s): {exc}")
        print(f"  minimal graph: {out / f'{name}.onnx'} ({len(last[0].graph.node)} nodes)")
        return False
    print(f"{name}: {examples} graphs, no counterexample ({time.perf_counter() - began:.0f} s)")
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("fuzz-out"))
    parser.add_argument("--only", choices=sorted(PROPERTIES), action="append")
    args = parser.parse_args()
    failed = [n for n in (args.only or PROPERTIES) if not fuzz(n, args.examples, args.seed, args.out)]
    return len(failed)


if __name__ == "__main__":
    sys.exit(main())
