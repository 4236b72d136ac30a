"""A LLaVA-shaped image description, converted (vision graph + cached text step, ONNX Runtime) against PyTorch eager
``model.generate``: the same tokens from the same image and prompt, medians of alternating runs.

The model is ``LlavaForConditionalGeneration`` with random weights (nothing is downloaded): a CLIP ViT-B/16-shaped
tower (hidden 768, 12 layers, 12 heads, a 224 x 224 image: 196 patches, each an image token) and a Llama text model
of ``--text`` shape (default: hidden 1024, 8 layers, 16 heads with 4 key-value heads, vocabulary 32064). One prompt of
196 image tokens and 24 text tokens; both systems decode exactly ``--tokens`` tokens (``min_new_tokens`` =
``max_new_tokens``), greedy, batch 1. Reports the whole ``generate`` (the vision tower and the prefill included), the
vision tower alone (eager ``get_image_features`` against the vision graph), and the per-token decode time (the
difference of two ``generate`` lengths, divided by the tokens between them), with the machine's load.

With ``--optimum PYTHON`` (the python of optimum-onnx's venv: ``benchmarks/peers/optimum_worker.py`` says how to make
it) and ``--genai`` (onnxruntime-genai in this venv), the peers a user would otherwise pick are tried first, each from
the model saved as a local checkpoint with a processor made here, in a new process:
``benchmarks/peers/vision_language_peers.py``. Neither builds a LLaVA (optimum-onnx 0.1.0, onnxruntime-genai 0.18.0):
the output says where each one raised, and the rounds are eager's and ours alone.

    python benchmarks/bench_vision_language.py                   # 32 tokens, 1 thread, 5 rounds
    python benchmarks/bench_vision_language.py --threads 2 --rounds 7
    python benchmarks/bench_vision_language.py --genai --optimum /work/bench-venvs/optimum/bin/python
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.append(str(Path(__file__).resolve().parents[1] / "tests"))
import tests_environment  # noqa: E402, F401 -- torchvision's operator schemas, before transformers imports it
import torch  # noqa: E402
import transformers  # noqa: E402
from bench_seq2seq import alternated  # noqa: E402

import pipeline  # noqa: E402

IMAGE_TOKEN = 32000
TOWER = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "image_size": 224,
    "patch_size": 16,
}
TEXT = {
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "num_hidden_layers": 8,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "vocab_size": 32064,
    "max_position_embeddings": 1024,
}


def llava() -> tuple[transformers.LlavaForConditionalGeneration, dict[str, torch.Tensor]]:
    """The model (random weights, drawn by fan-in so that its tokens vary) and one prompt with its image."""
    config = transformers.LlavaConfig(
        vision_config=transformers.CLIPVisionConfig(**TOWER),
        text_config=transformers.LlamaConfig(**TEXT),
        image_token_index=IMAGE_TOKEN,
        image_seq_length=196,
    )
    torch.manual_seed(0)
    model = transformers.LlavaForConditionalGeneration(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() >= 2:
                parameter.normal_(0, 1.5 / parameter.shape[-1] ** 0.5)
    model.generation_config.eos_token_id = None
    generator = torch.Generator().manual_seed(1)
    text = torch.randint(3, 32000, (1, 24), generator=generator)
    ids = torch.cat([text[:, :4], torch.full((1, 196), IMAGE_TOKEN), text[:, 4:]], dim=1)
    pixels = torch.randn(1, 3, 224, 224, generator=generator)
    return model, {"input_ids": ids, "attention_mask": torch.ones_like(ids), "pixel_values": pixels}


def peers(model: transformers.PreTrainedModel, optimum: Path | None, genai: bool) -> list[Any]:
    """The peers asked for, each tried on ``model`` saved as a checkpoint (:mod:`peers.vision_language_peers`)."""
    if optimum is None and not genai:
        return []
    from peers.vision_language_peers import save_checkpoint, try_genai, try_optimum

    attempts = []
    with tempfile.TemporaryDirectory() as work:
        checkpoint = Path(work) / "checkpoint"
        save_checkpoint(model, checkpoint, IMAGE_TOKEN)
        if optimum is not None:
            attempts.append(try_optimum(optimum, checkpoint, Path(work) / "optimum"))
        if genai:
            attempts.append(try_genai(checkpoint, Path(work) / "genai", Path(__file__).resolve().parents[1] / "tests"))
    for attempt in attempts:
        print(attempt.line(), file=sys.stderr, flush=True)
    return attempts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--optimum", type=Path, help="the python of optimum-onnx's venv: try its export of the model")
    parser.add_argument("--genai", action="store_true", help="try ONNX Runtime GenAI's builder on the model")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, inputs = llava()
    attempts = peers(model, args.optimum, args.genai)
    prompt = inputs["input_ids"].shape[1]
    start = time.perf_counter()
    module = pipeline.convert(
        model,
        inputs,
        generation={"max_length": prompt + args.tokens + 8, "max_batch": 1},
        validate=False,
        ort_intra_op_threads=args.threads,
        ort_allow_spinning=False,
    )
    converted = time.perf_counter() - start
    short = max(1, args.tokens // 4)

    def both(tokens: int) -> dict[str, Callable[[], object]]:
        options = {"max_new_tokens": tokens, "min_new_tokens": tokens}
        return {
            "eager": lambda: model.generate(**inputs, **options),
            "ours": lambda: module.generate(**inputs, **options),
        }

    with torch.no_grad():
        expected = both(args.tokens)["eager"]()
        same = torch.equal(both(args.tokens)["ours"](), expected)
        whole = alternated(both(args.tokens), args.rounds)
        brief = alternated(both(short), args.rounds)
        towers = alternated(
            {
                "eager": lambda: model.get_image_features(inputs["pixel_values"]),
                "ours": lambda: module.vision(inputs["pixel_values"]),
            },
            args.rounds,
        )
    load = os.getloadavg()[0]
    text = f"Llama {TEXT['hidden_size']} x {TEXT['num_hidden_layers']}"
    print(f"LLaVA shape (CLIP ViT-B/16 tower, {text}), random weights, a prompt of {prompt} tokens (196 image)")
    print(f"{args.tokens} new tokens, batch 1, {args.threads} thread(s)")
    print(f"conversion {converted:.1f} s (validate=False); same tokens as eager: {same}; load {load:.1f}")
    for attempt in attempts:
        print(f"{attempt.line()}\n    ({attempt.command})")
    print("| | generate (s) | vision tower (s) | decode ms/token | generate, CPU (s) |")
    print("|---|---|---|---|---|")
    for name in ("eager", "ours"):
        per_token = (whole[name][0] - brief[name][0]) / (args.tokens - short) * 1000
        print(f"| {name} | {whole[name][0]:.3f} | {towers[name][0]:.3f} | {per_token:.1f} | {whole[name][1]:.3f} |")
    ratio = whole["eager"][0] / whole["ours"][0]
    tower_ratio = towers["eager"][0] / towers["ours"][0]
    print(f"ours is {ratio:.2f}x eager for the whole generate (CPU {whole['eager'][1] / whole['ours'][1]:.2f}x), ")
    print(f"{tower_ratio:.2f}x for the vision tower")


if __name__ == "__main__":
    main()
