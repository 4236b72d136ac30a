"""The default generation conversion's wall time (issue 35 item 3), median of fresh processes, beside GenAI's builder.

The model of issue 35: a random ``LlamaForCausalLM`` (hidden 512, intermediate 1408, 8 layers, 8 heads over 4 KV
heads, vocab 32000, fp32, seed 0), converted with ``pipeline.convert(model, ids, generation={"max_length": 256,
"max_batch": 4})`` (``--max-length``: another capacity) on ONNX Runtime (a 128-token prompt as the sample). Each run
is a fresh process; the model is built before the clock starts and ``convert`` is timed as
``benchmarks/bench_generate.py`` times it (the call; the import of the conversion code, lazy, is printed apart).
Prints the load (``uptime``), each run's time and the report's stage times, the medians, and what the validation
checked.

``--compare DIR`` times the same conversion from another checkout of the repository too (``git archive <commit> |
tar -x -C DIR``: the code before a change), alternating with this one.

``--genai`` also times ONNX Runtime GenAI's builder on the same model saved with ``save_pretrained`` (``python -m
onnxruntime_genai.models.builder -i DIR -o OUT -p fp32 -e cpu``, its whole process as bench_generate times it),
alternating with ours run by run, so that both see the same load on a shared machine.

``--precision int4`` converts with ``precision="int4"`` as ``benchmarks/bench_generate.py``'s int4 column does (block
32, the head quantized, the rest in float32, ``MatMulNBits`` accuracy level 4) against GenAI's ``-p int4`` with the
same block and level.

    .venv/bin/python benchmarks/bench_convert_generation.py [--runs 3] [--genai] [--compare DIR] [--no-validate]
        [--precision int4] [--max-length 2048] [--profile out.html]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = (
    "vocab_size=32000, hidden_size=512, intermediate_size=1408, num_hidden_layers=8, num_attention_heads=8, "
    "num_key_value_heads=4, max_position_embeddings=2048, bos_token_id=1, eos_token_id=2"
)

_OURS = """
import json, sys, time
sys.path.insert(0, {root!r}); sys.path.append({tests!r})
import tests_environment  # noqa: F401
import torch, transformers
torch.manual_seed(0)
model = transformers.LlamaForCausalLM(transformers.LlamaConfig({model})).eval()
ids = torch.randint(0, 32000, (1, 128), generator=torch.Generator().manual_seed(1))
profiler = None
if {profile!r}:
    sys.path.insert(0, {pyinstrument!r})
    import pyinstrument
    profiler = pyinstrument.Profiler(interval=0.005)
    profiler.start()
start = time.perf_counter()
import pipeline
convert = pipeline.convert  # the lazy import of the conversion code
imported = time.perf_counter() - start
start = time.perf_counter()
generation = {{"max_length": {max_length}, "max_batch": 4}}
module = convert(model, ids, generation=generation, validate={validate!r}, **{settings!r})
seconds = time.perf_counter() - start
if profiler is not None:
    profiler.stop()
    open({profile!r}, "w").write(profiler.output_html())
    print(profiler.output_text(unicode=False, color=False, show_all=False), file=sys.stderr)
accuracy = module.report.accuracy
print(json.dumps({{
    "seconds": seconds, "import": imported, "stages": dict(module.report.stages),
    "checked": [] if accuracy is None else [
        f"step graph: {{accuracy.inputs}} inputs against the step in PyTorch",
        *(accuracy.decoding.summary_lines()[:1] + accuracy.decoding.summary_lines()[-1:] if accuracy.decoding else []),
    ],
}}))
"""

_CHECKPOINT = """
import sys
sys.path.append({tests!r})
import tests_environment  # noqa: F401
import torch, transformers
from tokenizers import Tokenizer, models, pre_tokenizers
torch.manual_seed(0)
model = transformers.LlamaForCausalLM(transformers.LlamaConfig({model})).eval()
model.save_pretrained(sys.argv[1])
words = Tokenizer(models.WordLevel({{"<unk>": 0, "<s>": 1, "</s>": 2, **{{f"w{{i}}": i for i in range(3, 32000)}}}},
                                   unk_token="<unk>"))
words.pre_tokenizer = pre_tokenizers.Whitespace()
transformers.PreTrainedTokenizerFast(tokenizer_object=words, unk_token="<unk>", bos_token="<s>",
                                     eos_token="</s>").save_pretrained(sys.argv[1])
"""

#: GenAI's builder as ``python -m`` runs it, after tests_environment (torchvision's schemas, for its imports)
_BUILDER = (
    "import runpy, sys, tests_environment; sys.argv[0] = 'builder'; "
    "runpy.run_module('onnxruntime_genai.models.builder', run_name='__main__')"
)


#: The int4 conversion of both (``--precision int4``): as ``benchmarks/bench_generate.py`` compares them
INT4_OURS = {
    "precision": "int4", "quantize_fallback": "fp32", "keep_head": False, "block_size": 32, "ort_int4_accuracy_level": 4
}  # fmt: skip
INT4_GENAI = ["-p", "int4", "--extra_options", "accuracy_level=4", "block_size=32"]


def ours(
    validate: bool, profile: str | None, root: Path = ROOT, precision: str = "fp32", max_length: int = 256
) -> dict[str, object]:
    """One conversion in a fresh process, with the code of ``root``: its record."""
    code = _OURS.format(
        root=str(root), tests=str(root / "tests"), model=MODEL, validate=validate, profile=profile or "",
        pyinstrument=os.environ.get("PYINSTRUMENT_PATH", ""), settings=INT4_OURS if precision == "int4" else {},
        max_length=max_length,
    )  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode:
        sys.exit(done.stderr[-4000:])
    if profile:
        print(done.stderr[-20000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def genai(checkpoint: Path, work: Path, precision: str = "fp32") -> float:
    """GenAI's builder in a fresh process for the CPU: its wall time (imports included)."""
    out = work / "genai"
    shutil.rmtree(out, ignore_errors=True)
    command = [sys.executable, "-c", _BUILDER, "-i", str(checkpoint), "-o", str(out), "-e", "cpu"]
    command += [*(INT4_GENAI if precision == "int4" else ["-p", "fp32"]), "-c", str(work / "genai_cache")]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(ROOT / "tests")}
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=work, check=False)
    seconds = time.perf_counter() - start
    if done.returncode:
        sys.exit(f"GenAI's builder failed:\n{done.stderr[-3000:]}")
    return seconds


def _line(result: dict[str, object]) -> str:
    stages = ", ".join(f"{k} {v:.1f}" for k, v in result["stages"].items())  # type: ignore[attr-defined]
    return f"{result['seconds']:.1f} s ({stages}; import {result['import']:.1f} s)"


def _summary(name: str, runs: list[dict[str, object]]) -> float:
    """Print the median time and each stage's median; the median."""
    median = statistics.median(r["seconds"] for r in runs)  # type: ignore[misc]
    print(f"{name} median: {median:.1f} s")
    for stage in runs[0]["stages"]:  # type: ignore[attr-defined]
        print(f"  {stage}: {statistics.median(r['stages'][stage] for r in runs):.1f} s")  # type: ignore[index]
    return median


def load() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--genai", action="store_true", help="time GenAI's builder too, alternating with ours")
    parser.add_argument("--compare", type=Path, help="time this checkout of the repository too, alternating")
    parser.add_argument("--no-validate", action="store_true")
    parser.add_argument("--precision", choices=("fp32", "int4"), default="fp32")
    parser.add_argument("--max-length", type=int, default=256, help="the cache's capacity (default 256)")
    parser.add_argument("--profile", help="write a pyinstrument profile (HTML) of one run here (PYINSTRUMENT_PATH)")
    options = parser.parse_args()
    print("load:", load(), "precision:", options.precision, "max_length:", options.max_length, flush=True)
    runs, builder, compared = [], [], []
    with tempfile.TemporaryDirectory(prefix="bench_convert_generation_") as temporary:
        work = Path(temporary)
        if options.genai:
            code = _CHECKPOINT.format(tests=str(ROOT / "tests"), model=MODEL)
            subprocess.run([sys.executable, "-c", code, str(work / "checkpoint")], cwd=ROOT, check=True)
        for index in range(1 if options.profile else options.runs):
            if options.genai:
                builder.append(genai(work / "checkpoint", work, options.precision))
                print(f"genai {index + 1}: {builder[-1]:.1f} s", flush=True)
            if options.compare:
                result = ours(
                    not options.no_validate, None, options.compare.resolve(), options.precision, options.max_length
                )
                print(f"compared {index + 1}: {_line(result)}", flush=True)
                compared.append(result)
            result = ours(
                not options.no_validate, options.profile, precision=options.precision, max_length=options.max_length
            )
            print(f"ours  {index + 1}: {_line(result)}", flush=True)
            runs.append(result)
    median = _summary("ours", runs)
    if compared:
        before = _summary(f"compared ({options.compare})", compared)
        print(f"ours / compared {median / before:.2f}")
    if builder:
        genai_median = statistics.median(builder)
        print(f"genai builder median: {genai_median:.1f} s; ours / genai {median / genai_median:.2f}")
        if compared:
            print(f"compared / genai {before / genai_median:.2f}")
    print("checked:", *runs[0]["checked"], sep="\n  ")  # type: ignore[misc]
    print("load:", load())


if __name__ == "__main__":
    main()
