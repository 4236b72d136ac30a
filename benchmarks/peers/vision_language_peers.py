"""The peers of ``benchmarks/bench_vision_language.py`` tried on its LLaVA: optimum-onnx's export and ONNX Runtime
GenAI's builder, each from the model saved as a local checkpoint (``save_pretrained``, with a processor made here:
nothing comes from a hub), each in a new process as a user runs it.

Neither builds this model (2026-12-02, optimum-onnx 0.1.0 and onnxruntime-genai 0.18.0): optimum-onnx has no ONNX
configuration for ``llava`` (nor an ``ORTModel`` class for image-text-to-text), and GenAI's builder has no
``LlavaForConditionalGeneration`` (nor its runtime a ``llava`` model type). The benchmark reports each attempt's error
and where the peer raised it, so that a newer release that does build it shows up as ``built`` rather than being
assumed absent; timing it then needs a runner for its output, which is not written.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import transformers

OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
#: GenAI's builder as ``python -m onnxruntime_genai.models.builder`` runs it, after tests_environment (torchvision's
#: schemas, without which its ``from transformers import ...`` of vision models fails in this environment)
BUILDER = (
    "import runpy, sys, tests_environment; sys.argv[0] = 'builder'; "
    "runpy.run_module('onnxruntime_genai.models.builder', run_name='__main__')"
)
#: optimum's command line (``optimum-cli``) in its venv's python
OPTIMUM_CLI = "import sys; from optimum.commands.optimum_cli import main; sys.argv[0] = 'optimum-cli'; main()"
FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)')
RAISED = re.compile(r"^(?P<name>[A-Za-z_.]*(Error|Exception)): (?P<message>.*)$")


@dataclass(frozen=True)
class Attempt:
    """One peer's try at building the checkpoint."""

    peer: str
    command: str
    seconds: float
    built: bool
    error: str = ""
    where: str = ""

    def line(self) -> str:
        """One line for the benchmark's output."""
        if self.built:
            return f"{self.peer}: built in {self.seconds:.1f} s (not timed here: no runner for its output yet)"
        return f"{self.peer}: FAILED after {self.seconds:.1f} s at {self.where}: {self.error}"


def save_checkpoint(model: transformers.PreTrainedModel, directory: Path, image_token: int) -> None:
    """``model`` saved with ``save_pretrained`` and a ``LlavaProcessor`` made here: a word-level tokenizer of the
    ids below ``image_token`` and ``<image>`` as ``image_token``, and a 224 x 224 ``CLIPImageProcessor``."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    model.save_pretrained(directory)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, image_token)}, "<image>": image_token}
    words = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=words, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    images = transformers.CLIPImageProcessor(size={"shortest_edge": 224}, crop_size={"height": 224, "width": 224})
    processor = transformers.LlavaProcessor(
        image_processor=images,
        tokenizer=tokenizer,
        patch_size=model.config.vision_config.patch_size,
        vision_feature_select_strategy=model.config.vision_feature_select_strategy,
        num_additional_image_tokens=1,
        image_token="<image>",
    )
    processor.save_pretrained(directory)


def attempt(peer: str, command: list[str], shown: str, env: dict[str, str], cwd: Path) -> Attempt:
    """Run ``command`` (a new process, timed); a failure is its last exception and the peer's frame that raised it."""
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **OFFLINE, **env}, cwd=cwd)
    seconds = time.perf_counter() - start
    if done.returncode == 0:
        return Attempt(peer, shown, seconds, built=True)
    lines = done.stderr.splitlines()
    raised = [i for i, text in enumerate(lines) if RAISED.match(text)]
    if not raised:
        tail = " | ".join(lines[-3:])
        return Attempt(peer, shown, seconds, built=False, error=f"exit {done.returncode}: {tail}", where="?")
    last = raised[-1]
    frames = [FRAME.search(text) for text in lines[:last]]
    where = next((f"{m['file']}:{m['line']}" for m in reversed(frames) if m), "?")
    site = "site-packages/"
    first_sentence = lines[last].split(". ")[0][:300]
    return Attempt(peer, shown, seconds, built=False, error=first_sentence, where=where.split(site)[-1])


def try_optimum(python: Path, checkpoint: Path, out: Path) -> Attempt:
    """``optimum-cli export onnx --model CKPT --task image-text-to-text OUT`` in optimum-onnx's venv (the export
    ``ORTModelForVision2Seq.from_pretrained(CKPT, export=True)`` also reaches, with the same error)."""
    arguments = ["export", "onnx", "--model", str(checkpoint), "--task", "image-text-to-text", str(out)]
    version = subprocess.run(
        [str(python), "-c", "from importlib import metadata; print(metadata.version('optimum-onnx'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    shown = "optimum-cli " + " ".join(arguments)
    return attempt(f"optimum-onnx {version}", [str(python), "-c", OPTIMUM_CLI, *arguments], shown, {}, out.parent)


def try_genai(checkpoint: Path, out: Path, tests: Path) -> Attempt:
    """``python -m onnxruntime_genai.models.builder -i CKPT -o OUT -p fp32 -e cpu`` in this venv."""
    from importlib import metadata

    arguments = ["-i", str(checkpoint), "-o", str(out), "-p", "fp32", "-e", "cpu", "-c", str(out.parent / "cache")]
    shown = "python -m onnxruntime_genai.models.builder " + " ".join(arguments)
    peer = f"onnxruntime-genai {metadata.version('onnxruntime-genai')}"
    return attempt(peer, [sys.executable, "-c", BUILDER, *arguments], shown, {"PYTHONPATH": str(tests)}, out.parent)
