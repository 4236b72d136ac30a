"""optimum-onnx's ``ORTModelForCausalLM`` as a worker of ``benchmarks/bench_generate.py`` (and its
``ORTModelForSpeechSeq2Seq`` of ``benchmarks/bench_seq2seq.py``), run in its own venv.

optimum-onnx 0.1 pins ``transformers<4.58``, older than the repository's, so it cannot share ``.venv``. Create its
environment once (torch pinned first: an unpinned torch pulls several GB of CUDA wheels)::

    python3 -m venv /work/bench-venvs/optimum
    /work/bench-venvs/optimum/bin/pip install torch==2.13.0
    /work/bench-venvs/optimum/bin/pip install "optimum-onnx[onnxruntime]==0.1.0"

The benchmark starts this script with that venv's python and talks to it in JSON lines: one request per line on
stdin, one answer per line on stdout (anything the libraries print goes to stderr). Requests:

- ``{"op": "versions"}`` -> the versions of optimum-onnx, transformers, onnxruntime and torch;
- ``{"op": "export", "checkpoint": DIR, "out": DIR}`` -> ``ORTModelForCausalLM.from_pretrained(DIR, export=True)``
  saved to ``out``, with the wall time (optimum's conversion); ``"kind": "speech-seq2seq"`` (here and in ``load``):
  ``ORTModelForSpeechSeq2Seq`` instead (Whisper: an encoder and a decoder with its past);
- ``{"op": "load", "dir": DIR, "threads": T, "spinning": false}`` -> the exported model loaded with ONNX Runtime's
  intra-op threads ``T`` (and torch's threads, which pick the tokens), with the wall time;
- ``{"op": "generate", "ids": [[...]], "new_tokens": N}`` -> greedy ``model.generate`` with a streamer that stamps
  each new token: the tokens, the seconds to the first new token (prefill) and from the first to the last (decode);
- ``{"op": "transcribe", "features": FILE.npy, "new_tokens": N}`` -> greedy ``model.generate(input_features)`` of
  exactly ``N`` new tokens: the tokens and the wall seconds of the whole call (encoder included);
- ``{"op": "quit"}``.

Every answer has ``"ok"``; a failed request answers ``{"ok": false, "error": "..."}`` and the worker goes on.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from importlib import metadata
from typing import Any, TextIO

# the protocol's channel; everything else any library prints goes to stderr
CHANNEL: TextIO = sys.stdout
sys.stdout = sys.stderr


class StampingStreamer:
    """transformers' streamer protocol (``put``/``end``): the time of each ``put`` after the prompt's."""

    def __init__(self) -> None:
        self.stamps: list[float] = []
        self.prompt_seen = False

    def put(self, value: Any) -> None:
        """The first call carries the prompt; every later one a new token per row."""
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        self.stamps.append(time.perf_counter())

    def end(self) -> None:
        """Nothing to flush."""


class Worker:
    """Holds the loaded model between requests."""

    def __init__(self) -> None:
        self.model: Any = None

    def versions(self, request: dict[str, Any]) -> dict[str, Any]:
        """Versions of the packages that make the column."""
        names = ("optimum-onnx", "optimum", "transformers", "onnxruntime", "torch")
        return {"versions": {name: metadata.version(name) for name in names}}

    def export(self, request: dict[str, Any]) -> dict[str, Any]:
        """optimum's conversion of the checkpoint, saved for :meth:`load`."""
        start = time.perf_counter()
        kind = model_class(request)
        model = kind.from_pretrained(request["checkpoint"], export=True, provider="CPUExecutionProvider")
        model.save_pretrained(request["out"])
        return {"seconds": time.perf_counter() - start}

    def load(self, request: dict[str, Any]) -> dict[str, Any]:
        """The exported model with ``threads`` intra-op threads, spinning as asked."""
        import onnxruntime
        import torch

        threads = int(request["threads"])
        torch.set_num_threads(threads)
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        spin = "1" if request.get("spinning") else "0"
        options.add_session_config_entry("session.intra_op.allow_spinning", spin)
        options.add_session_config_entry("session.inter_op.allow_spinning", spin)
        self.model = None
        start = time.perf_counter()
        self.model = model_class(request).from_pretrained(
            request["dir"], session_options=options, provider="CPUExecutionProvider"
        )
        return {"seconds": time.perf_counter() - start}

    def generate(self, request: dict[str, Any]) -> dict[str, Any]:
        """Greedy decoding of the prompts, stamped per token."""
        import torch

        if self.model is None:
            raise RuntimeError("no model loaded: send a load request first")
        ids = torch.tensor(request["ids"], dtype=torch.int64)
        new = int(request["new_tokens"])
        streamer = StampingStreamer()
        with torch.inference_mode():
            start = time.perf_counter()
            out = self.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=new,
                min_new_tokens=0,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
                streamer=streamer,
            )
        stamps = streamer.stamps
        return {
            "tokens": out[:, ids.shape[1] :].tolist(),
            "prefill_s": stamps[0] - start,
            "decode_s": stamps[-1] - stamps[0],
            "steps": len(stamps),
        }

    def transcribe(self, request: dict[str, Any]) -> dict[str, Any]:
        """Greedy decoding of exactly ``new_tokens`` tokens from the features file, timed whole."""
        import numpy
        import torch

        if self.model is None:
            raise RuntimeError("no model loaded: send a load request first")
        features = torch.from_numpy(numpy.load(request["features"]))
        new = int(request["new_tokens"])
        with torch.inference_mode():
            start = time.perf_counter()
            out = self.model.generate(features, max_new_tokens=new, min_new_tokens=new, do_sample=False, num_beams=1)
            seconds = time.perf_counter() - start
        return {"tokens": out.tolist(), "seconds": seconds}


def model_class(request: dict[str, Any]) -> Any:
    """optimum's class for the request's ``kind`` (a causal LM unless it says ``speech-seq2seq``)."""
    from optimum.onnxruntime import ORTModelForCausalLM, ORTModelForSpeechSeq2Seq

    return ORTModelForSpeechSeq2Seq if request.get("kind") == "speech-seq2seq" else ORTModelForCausalLM


def main() -> None:
    """Answer requests until ``quit`` or the end of stdin."""
    worker = Worker()
    handlers = {
        "versions": worker.versions,
        "export": worker.export,
        "load": worker.load,
        "generate": worker.generate,
        "transcribe": worker.transcribe,
    }
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        if request.get("op") == "quit":
            break
        try:
            answer = {"ok": True, **handlers[request["op"]](request)}
        except Exception as error:  # noqa: BLE001 -- every failure goes back to the benchmark, which reports it
            traceback.print_exc()
            answer = {"ok": False, "error": f"{type(error).__name__}: {error}"}
        CHANNEL.write(json.dumps(answer) + "\n")
        CHANNEL.flush()


if __name__ == "__main__":
    main()
