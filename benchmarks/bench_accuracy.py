"""The accuracy rule on real models: the fixed rule against the rule anchored to PyTorch's own precision.

Each model (random weights, a small input) is converted with validation on, once per rule, and once more with a
planted 1% error (a pass that scales the first graph output by 1.01) under the anchored rule, which must fail.
Models are the false failures of issue 28: torchvision's wide_resnet50_2, FCN-ResNet50 and RAFT in fp32, CLIP and
timm's csatv2 and caformer_s18 in fp16. Each run is its own subprocess (crash and memory isolation); validation
uses the default 3 drawn inputs beside the sample.

Run from the repository root (the "before" column can be any checkout: PYTHONPATH picks the pipeline)::

    python benchmarks/bench_accuracy.py                          # every model, both rules, the planted error
    python benchmarks/bench_accuracy.py --models wide_resnet50_2 --runs anchored
    PYTHONPATH=/path/to/old/checkout python benchmarks/bench_accuracy.py --runs fixed   # the rule before
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: model -> precision it is judged in
MODELS = {
    "wide_resnet50_2": "fp32",
    "fcn_resnet50": "fp32",
    "raft_small": "fp32",
    "clip": "fp16",
    "csatv2": "fp16",
    "caformer_s18": "fp16",
}
RUNS = ("fixed", "anchored", "planted")


def build(name: str) -> tuple[Any, Any]:
    """The model (random weights, eval) and its sample."""
    import torch

    torch.manual_seed(0)
    if name == "wide_resnet50_2":
        from torchvision.models import wide_resnet50_2

        return wide_resnet50_2(weights=None).eval(), torch.randn(1, 3, 64, 64)
    if name == "fcn_resnet50":
        from torchvision.models.segmentation import fcn_resnet50

        model = fcn_resnet50(weights=None, weights_backbone=None, aux_loss=False).eval()
        return model, torch.randn(1, 3, 128, 128)
    if name == "raft_small":
        from torchvision.models.optical_flow import raft_small

        images = (torch.randn(1, 3, 128, 128), torch.randn(1, 3, 128, 128))
        return raft_small(weights=None).eval(), (images, {"num_flow_updates": 4})
    if name == "clip":
        import transformers

        config = transformers.CLIPConfig(
            text_config={"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4},
            vision_config={
                "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                "image_size": 64, "patch_size": 16,
            },
            projection_dim=32,
        )  # fmt: skip
        inputs = {"input_ids": torch.randint(0, 1000, (4, 8)), "pixel_values": torch.randn(4, 3, 64, 64)}
        return transformers.CLIPModel(config).eval(), ((), inputs)
    import timm

    return timm.create_model(name, pretrained=False).eval(), torch.randn(1, 3, 64, 64)


def planted_pass() -> Any:
    """A pass that multiplies the first graph output by 1.01 (once): a real 1% error."""
    import numpy as np
    import onnx_graphsurgeon as gs

    from passes import PassResult

    class PlantError:
        name = "plant_one_percent"

        def __call__(self, graph: gs.Graph, settings: Any) -> PassResult:
            if any(n.name == "planted_error" for n in graph.nodes):
                return PassResult(graph, False)
            out = graph.outputs[0]
            inner = gs.Variable("planted_inner", dtype=out.dtype, shape=out.shape)
            producer = out.inputs[0]
            producer.outputs[producer.outputs.index(out)] = inner
            scale = gs.Constant("planted_scale", np.array(1.01, dtype=np.float32))
            graph.nodes.append(gs.Node("Mul", "planted_error", inputs=[inner, scale], outputs=[out]))
            return PassResult(graph, True)

    return PlantError()


def run_one(name: str, run: str) -> dict[str, Any]:
    """Convert ``name`` under ``run``'s rule; the verdict, the failing summary and the times."""
    sys.path.insert(0, str(ROOT / "tests"))
    import logging

    import tests_environment  # noqa: F401  (torchvision's schemas before any model library)

    import pipeline
    from converters.errors import AccuracyError

    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s", stream=sys.stderr)
    model, sample = build(name)
    kwargs: dict[str, Any] = {"backend": "onnxruntime", "precision": MODELS[name]}
    if "accuracy_anchor" in {f.name for f in dataclasses.fields(pipeline.Settings)}:  # a checkout before it: fixed
        kwargs["accuracy_anchor"] = run != "fixed"
    if run == "planted":
        kwargs["extra_passes"] = [("after", "toposort", planted_pass())]
    start = time.perf_counter()
    try:
        module = pipeline.convert(model, sample, **kwargs)
        outputs = module.report.accuracy.outputs
        verdict, detail = "pass", "; ".join(o.summary() for o in outputs if o.note and "fixed tolerance" in o.note)
        stages = dict(module.report.stages) if hasattr(module.report, "stages") else {}
    except AccuracyError as error:
        verdict, detail, stages = "FAIL", str(error).split("\n")[0][:600], {}
    return {"model": name, "run": run, "verdict": verdict, "seconds": time.perf_counter() - start,
            "validate_s": stages.get("validate"), "detail": detail}  # fmt: skip


def main() -> None:
    """Run every model under every rule asked for, each in a subprocess, and print a table (JSON with --json)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    parser.add_argument("--runs", nargs="*", default=list(RUNS), choices=RUNS)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)  # model run: the child's work
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(*args.one)))
        return
    rows = []
    for name in args.models:
        for run in args.runs:
            child = subprocess.run(
                [sys.executable, __file__, "--one", name, run], capture_output=True, text=True, env=dict(os.environ)
            )
            lines = child.stdout.strip().splitlines()
            crash = {"model": name, "run": run, "verdict": "crash", "detail": child.stderr.strip()[-300:]}
            row = json.loads(lines[-1]) if child.returncode == 0 and lines else crash
            anchor_lines = [line for line in child.stderr.splitlines() if "anchor type" in line]
            row["anchor_runs"] = anchor_lines[-1].split(": ", 1)[-1] if anchor_lines else ""
            rows.append(row)
            print(f"{name:16} {MODELS[name]:5} {run:9} {row['verdict']:5} {row.get('seconds', 0):7.1f}s  "
                  f"{row['anchor_runs']}\n    {row.get('detail', '')}", flush=True)  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
