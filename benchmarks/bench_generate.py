"""Generation side by side: ours against ONNX Runtime GenAI, optimum-onnx and PyTorch eager, in one run.

The model is a random-weight ``transformers.LlamaForCausalLM`` (hidden 512, intermediate 1408, 8 layers, 8 heads / 4
KV heads, vocab 32000, fp32, ``max_position_embeddings`` 8192) saved with ``save_pretrained`` beside a word-level
``PreTrainedTokenizerFast`` of 32000 entries built here (nothing is downloaded). The head's row of the eos token is
zeroed, so its logit is always 0, below the top logit, and no system stops before its 64 tokens.

Systems (each cell runs them in turn, A B C D, A B C D, ... so that the machine's noise hits all alike):

- ``ours``: ``pipeline.convert(model, ids, generation={"max_length": L, "max_batch": 4})`` (default settings,
  validation included; the int4 column with ``precision="int4"``), saved, ``pipeline.load(path, threads=T,
  spinning=False)``, ``module.generate(ids, max_new_tokens=64)``; each conversion in a child process capped in memory,
  without validation above ``--validate-up-to`` (a failed default conversion is redone with ``validate=False``);
- ``genai``: ONNX Runtime GenAI, its builder from the saved checkpoint (``python -m
  onnxruntime_genai.models.builder -i DIR -o OUT -p fp32|int4 -e cpu``), ``og.Model`` with intra-op threads ``T``
  and spinning off in genai_config.json's ``session_options``, an ``og.Generator`` with search options
  ``max_length=L``, greedy;
- ``optimum``: optimum-onnx's ``ORTModelForCausalLM`` (exported from the checkpoint, loaded with ``T`` threads and
  spinning off), in its own venv (its transformers pin conflicts with ours): ``benchmarks/peers/optimum_worker.py``
  says how to create it; without it the column is skipped;
- ``eager``: PyTorch ``model.generate`` (transformers' DynamicCache), ``torch.set_num_threads(T)``;
- ``floor`` (fp32): not a system but the ceiling of any: ONNX Runtime running only the model's weight MatMuls, each
  matrix read once per step, ``T`` threads. A decode step reads every weight, so no system's fp32 decode is faster;
  the ratios table gives the floor's tokens/s against GenAI's (below 1.1x: 1.1x GenAI is beyond this machine).

Per cell (precision, threads, max_length, batch): decode tokens/s (the new tokens after the first, per row x batch,
over the time from the first new token to the last) and prefill ms (the call's start to its first new token: the
128-token prompt through the model), medians of ``--runs`` after one untimed warm-up run. Greedy tokens are compared
with PyTorch eager's (fp32) and ours with GenAI's (int4). Also timed: our default generation conversion against
GenAI's builder (and optimum's export), loading our artifact (``pipeline.load``) against creating GenAI's ``og.Model``,
in this process and in a fresh one (import included).

Run from the repository root::

    python benchmarks/bench_generate.py                                   # everything (long)
    python benchmarks/bench_generate.py --threads 1 --batch 1 --max-length 256 --precision fp32 --systems ours,genai
    python benchmarks/bench_generate.py --tiny --runs 1 --no-validate     # a tiny model: checks the harness
    python benchmarks/bench_generate.py --tables benchmarks/results/bench_generate_2026-11-28.json  # a saved run
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import gc
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# the repository first: with an editable install tests/pipeline (a test folder, no __init__) would otherwise be
# taken as a namespace package `pipeline` before the install's finder is asked
sys.path.insert(0, str(ROOT))
sys.path.append(str(ROOT / "tests"))
import numpy as np  # noqa: E402
import tests_environment  # noqa: E402, F401 -- torchvision's operator schemas, before transformers imports it
import torch  # noqa: E402
import transformers  # noqa: E402

import pipeline  # noqa: E402

SYSTEMS = ("ours", "genai", "optimum", "eager", "floor")
PRECISIONS = ("fp32", "int4")
#: which systems have a column at each precision (optimum, eager and the weight-reading floor run fp32 only)
RUNS_AT = {"fp32": SYSTEMS, "int4": ("ours", "genai")}
PROMPT, NEW, MAX_BATCH = 128, 64, 4
VOCAB, BOS, EOS = 32000, 1, 2
MODEL = {
    "hidden_size": 512,
    "intermediate_size": 1408,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
}
#: --tiny: the same vocabulary and tokenizer, a model small enough to check the harness in a minute
TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
OPTIMUM_PYTHON = Path("/work/bench-venvs/optimum/bin/python")
OPTIMUM_WORKER = ROOT / "benchmarks" / "peers" / "optimum_worker.py"
#: ONNX Runtime GenAI's builder as ``python -m`` runs it, after tests_environment: without torchvision's schemas the
#: builder's ``from transformers import ...`` of vision models fails in this environment
BUILDER = (
    "import runpy, sys, tests_environment; sys.argv[0] = 'builder'; "
    "runpy.run_module('onnxruntime_genai.models.builder', run_name='__main__')"
)
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def log(message: str) -> None:
    """Progress on stderr (stdout carries the tables)."""
    print(f"[{time.strftime('%H:%M:%S')} load {os.getloadavg()[0]:.2f}] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------- the model


def build_checkpoint(directory: Path, shape: dict[str, int]) -> transformers.LlamaForCausalLM:
    """The random-weight Llama (seed 0) saved with ``save_pretrained``, a tokenizer beside it; the model."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        max_position_embeddings=8192,
        bos_token_id=BOS,
        eos_token_id=EOS,
        dtype=torch.float32,
        **shape,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # the eos logit is always 0, below the top one: no system stops before NEW tokens
        model.lm_head.weight[EOS].zero_()
    model.save_pretrained(directory)
    save_tokenizer(directory)
    return model


def save_tokenizer(directory: Path) -> None:
    """A word-level ``PreTrainedTokenizerFast`` of VOCAB entries (``<unk>`` 0, ``<s>`` BOS, ``</s>`` EOS, ``w3``...)
    saved in ``directory``: what GenAI's builder and runtime read beside a checkpoint (nothing is downloaded)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": BOS, "</s>": EOS, **{f"w{i}": i for i in range(3, VOCAB)}}
    words = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=words, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    tokenizer.save_pretrained(directory)


def prompts() -> np.ndarray:
    """MAX_BATCH prompts of PROMPT ids (no special token); batch b takes the first b rows."""
    return np.random.default_rng(0).integers(3, VOCAB, (MAX_BATCH, PROMPT)).astype(np.int64)


# ---------------------------------------------------------------------------------------------------- timing


@dataclasses.dataclass
class Run:
    """One timed generation: the new tokens [batch, NEW], seconds to the first new token, seconds after it."""

    tokens: np.ndarray
    prefill_s: float
    decode_s: float

    @property
    def decode_tok_s(self) -> float:
        """New tokens after the first, per row x batch, per second."""
        batch, new = self.tokens.shape
        return (new - 1) * batch / self.decode_s


class StampingStreamer:
    """transformers' streamer protocol (``put``/``end``), which ``GenerativeModule.generate`` follows too: the time
    of each ``put`` after the prompt's."""

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


@contextmanager
def quiet_gc() -> Iterator[None]:
    """A collection before the timed call and none inside it."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


# ---------------------------------------------------------------------------------------------------- systems


class System:
    """One column: made ready for a (precision, threads, max_length) and asked to generate."""

    name = ""

    def prepare(self, precision: str, threads: int, max_length: int) -> None:
        """Load what the cell needs (the artifact built for it, with these threads)."""

    def generate(self, ids: np.ndarray) -> Run:
        """Greedy NEW tokens of the prompts, timed."""
        raise NotImplementedError

    def close(self) -> None:
        """Free what :meth:`prepare` loaded."""


class Ours(System):
    """``pipeline.convert(... generation=...)``, saved and loaded with the cell's threads."""

    name = "ours"

    def __init__(
        self, checkpoint: Path, work: Path, validate_up_to: int, int4: dict[str, Any], memory_gb: float
    ) -> None:
        self.checkpoint, self.work, self.validate_up_to, self.int4 = checkpoint, work, validate_up_to, int4
        self.memory_gb = memory_gb
        self.artifacts: dict[tuple[str, int], Path] = {}
        self.module: Any = None

    def settings(self, precision: str, max_length: int) -> dict[str, Any]:
        """The conversion's settings beyond the defaults."""
        extra: dict[str, Any] = {} if max_length <= self.validate_up_to else {"validate": False}
        return {**extra, **(self.int4 if precision == "int4" else {})}

    def convert(self, precision: str, max_length: int) -> dict[str, Any]:
        """Convert in a child process (the conversion timed there), capped in memory so that running out fails the
        conversion instead of waking the kernel's OOM killer on a shared machine; a default conversion that fails is
        done again with ``validate=False`` so that the cells still run. The record of the conversion."""
        path = self.work / f"ours_{precision}_{max_length}.ptrt"
        settings = self.settings(precision, max_length)
        record = self._child(path, max_length, settings)
        if "error" in record and settings.get("validate", True):
            log(f"ours: the default conversion failed ({record['error'][-300:]}); converting with validate=False")
            retry = self._child(path, max_length, {**settings, "validate": False})
            record = {**retry, "default_conversion_error": record["error"]}
        if "error" not in record:
            self.artifacts[precision, max_length] = path
        return record

    def _child(self, path: Path, max_length: int, settings: dict[str, Any]) -> dict[str, Any]:
        """One conversion in a new process of this script (``--convert-child``); its record or its error."""
        spec = {"checkpoint": str(self.checkpoint), "max_length": max_length, "settings": settings, "out": str(path)}
        limit = int(self.memory_gb * 2**30)

        def cap() -> None:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--convert-child", json.dumps(spec)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            preexec_fn=cap,
        )
        process_s = time.perf_counter() - start
        lines = done.stdout.strip().splitlines()
        if done.returncode != 0 or not lines:
            return {"error": f"exit {done.returncode}: {done.stderr.strip()[-1500:]}", "process_s": process_s}
        return {**json.loads(lines[-1]), "process_s": process_s}

    def load(self, precision: str, max_length: int, threads: int) -> tuple[Any, float]:
        """``pipeline.load`` of the cell's artifact (timed)."""
        path = self.artifacts[precision, max_length]
        with quiet_gc():
            start = time.perf_counter()
            module = pipeline.load(path, threads=threads, spinning=False)
            return module, time.perf_counter() - start

    def cold_load(self, precision: str, max_length: int, threads: int) -> float:
        """A fresh process's import of ``pipeline`` and load of the artifact (seconds, measured in it)."""
        code = (
            "import sys, time; start = time.perf_counter(); sys.path.insert(0, sys.argv[1]); import pipeline; "
            "pipeline.load(sys.argv[2], threads=int(sys.argv[3]), spinning=False); "
            "print(time.perf_counter() - start)"
        )
        path = self.artifacts[precision, max_length]
        out = subprocess.run(
            [sys.executable, "-c", code, str(ROOT), str(path), str(threads)],
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
        )
        return float(out.stdout.strip().splitlines()[-1])

    def prepare(self, precision: str, threads: int, max_length: int) -> None:
        """The cell's artifact with its threads."""
        self.module = None
        self.module, _ = self.load(precision, max_length, threads)

    def generate(self, ids: np.ndarray) -> Run:
        """``module.generate`` with a stamping streamer (eos off: every row makes NEW tokens)."""
        prompt = torch.from_numpy(ids)
        streamer = StampingStreamer()
        start = time.perf_counter()
        out = self.module.generate(prompt, max_new_tokens=NEW, eos_token_id=[], streamer=streamer)
        stamps = streamer.stamps
        return Run(out[:, ids.shape[1] :].numpy(), stamps[0] - start, stamps[-1] - stamps[0])

    def close(self) -> None:
        """Drop the module."""
        self.module = None


class GenAI(System):
    """ONNX Runtime GenAI: its builder's model, ``og.Model`` with the cell's threads, an ``og.Generator``."""

    name = "genai"

    def __init__(self, checkpoint: Path, work: Path, int4_options: dict[str, int]) -> None:
        import onnxruntime  # noqa: F401 -- loaded first, the library GenAI then finds
        import onnxruntime_genai

        self.og = onnxruntime_genai
        self.checkpoint, self.work, self.int4_options = checkpoint, work, int4_options
        self.built: dict[str, Path] = {}
        self.model: Any = None
        self.max_length = 0

    def build(self, precision: str) -> dict[str, Any]:
        """The builder from the saved checkpoint, in a new process (timed, its imports included); its record."""
        out = self.work / f"genai_{precision}"
        shutil.rmtree(out, ignore_errors=True)
        command = [sys.executable, "-c", BUILDER, "-i", str(self.checkpoint), "-o", str(out)]
        command += ["-p", precision, "-e", "cpu", "-c", str(self.work / "genai_cache")]
        if precision == "int4":
            command += ["--extra_options", *(f"{key}={value}" for key, value in self.int4_options.items())]
        env = {**os.environ, **OFFLINE, "PYTHONPATH": str(ROOT / "tests")}
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=self.work)
        seconds = time.perf_counter() - start
        if done.returncode != 0:
            raise RuntimeError(f"the GenAI builder failed ({done.returncode}):\n{done.stderr[-3000:]}")
        self.built[precision] = out
        record: dict[str, Any] = {
            "seconds": seconds,
            "command": "python -m onnxruntime_genai.models.builder " + " ".join(command[3:]),
            "artifact_mb": sum(p.stat().st_size for p in out.iterdir() if p.is_file()) / 2**20,
            **graph_facts(out / "model.onnx"),
        }
        return record

    def config(self, precision: str, threads: int) -> Any:
        """The built model's config with ``threads`` intra-op threads and spinning off (genai_config.json's
        ``session_options``, where a key GenAI does not know becomes a session config entry)."""
        config = self.og.Config(str(self.built[precision]))
        options = {
            "intra_op_num_threads": threads,
            "session.intra_op.allow_spinning": "0",
            "session.inter_op.allow_spinning": "0",
        }
        config.overlay(json.dumps({"model": {"decoder": {"session_options": options}}}))
        return config

    def load(self, precision: str, threads: int) -> tuple[Any, float]:
        """``og.Config`` and ``og.Model`` (timed)."""
        with quiet_gc():
            start = time.perf_counter()
            model = self.og.Model(self.config(precision, threads))
            return model, time.perf_counter() - start

    def cold_load(self, precision: str, threads: int) -> float:
        """A fresh process's import of onnxruntime_genai and ``og.Model`` (seconds, measured in it)."""
        options = {
            "intra_op_num_threads": threads,
            "session.intra_op.allow_spinning": "0",
            "session.inter_op.allow_spinning": "0",
        }
        overlay = json.dumps({"model": {"decoder": {"session_options": options}}})
        code = (
            "import sys, time; start = time.perf_counter(); import onnxruntime, onnxruntime_genai as og; "
            "config = og.Config(sys.argv[1]); config.overlay(sys.argv[2]); og.Model(config); "
            "print(time.perf_counter() - start)"
        )
        out = subprocess.run(
            [sys.executable, "-c", code, str(self.built[precision]), overlay],
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
        )
        return float(out.stdout.strip().splitlines()[-1])

    def prepare(self, precision: str, threads: int, max_length: int) -> None:
        """The built model with the cell's threads; ``max_length`` goes to each generator's search options."""
        self.model = None
        self.model, _ = self.load(precision, threads)
        self.max_length = max_length

    def generate(self, ids: np.ndarray) -> Run:
        """A generator per call (its cache of ``max_length`` included in the prefill), greedy, NEW tokens."""
        og = self.og
        batch = ids.shape[0]
        prompt = ids.astype(np.int32)
        tokens = []
        start = time.perf_counter()
        params = og.GeneratorParams(self.model)
        params.set_search_options(max_length=self.max_length, do_sample=False, batch_size=batch)
        generator = og.Generator(self.model, params)
        generator.append_tokens(prompt)
        generator.generate_next_token()
        tokens.append(generator.get_next_tokens().copy())
        first = time.perf_counter()
        for _ in range(NEW - 1):
            generator.generate_next_token()
            tokens.append(generator.get_next_tokens().copy())
        last = time.perf_counter()
        del generator
        return Run(np.stack(tokens, axis=1).astype(np.int64).reshape(batch, NEW), first - start, last - first)

    def close(self) -> None:
        """Drop the model."""
        self.model = None


class Optimum(System):
    """optimum-onnx's ``ORTModelForCausalLM`` in its own venv, through ``benchmarks/peers/optimum_worker.py``."""

    name = "optimum"

    def __init__(self, python: Path, checkpoint: Path, work: Path) -> None:
        self.checkpoint, self.out = checkpoint, work / "optimum_fp32"
        self.stderr = (work / "optimum_worker.log").open("w")
        self.process = subprocess.Popen(
            [str(python), str(OPTIMUM_WORKER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            env={**os.environ, **OFFLINE},
            cwd=work,
        )
        self.threads = 0

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        """One request, one answer; a failure is an exception naming the worker's log."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the optimum worker exited; see {self.stderr.name}")
        answer: dict[str, Any] = json.loads(line)
        if not answer.get("ok"):
            raise RuntimeError(f"optimum worker: {answer.get('error')} (traceback in {self.stderr.name})")
        return answer

    def versions(self) -> dict[str, str]:
        """The worker venv's versions."""
        return dict(self.ask({"op": "versions"})["versions"])

    def export(self) -> dict[str, Any]:
        """optimum's export of the checkpoint (timed in the worker)."""
        return {
            "seconds": self.ask({"op": "export", "checkpoint": str(self.checkpoint), "out": str(self.out)})["seconds"]
        }

    def load(self, threads: int) -> float:
        """Load the export with ``threads`` (timed in the worker)."""
        self.threads = threads
        return float(self.ask({"op": "load", "dir": str(self.out), "threads": threads, "spinning": False})["seconds"])

    def prepare(self, precision: str, threads: int, max_length: int) -> None:
        """Reload only when the threads change (max_length means nothing to its growing cache)."""
        if threads != self.threads:
            self.load(threads)

    def generate(self, ids: np.ndarray) -> Run:
        """``model.generate`` in the worker."""
        answer = self.ask({"op": "generate", "ids": ids.tolist(), "new_tokens": NEW})
        return Run(np.asarray(answer["tokens"], dtype=np.int64), answer["prefill_s"], answer["decode_s"])

    def close(self) -> None:
        """Stop the worker."""
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.write(json.dumps({"op": "quit"}) + "\n")
            self.process.stdin.flush()
            self.process.wait(timeout=60)
        self.stderr.close()


class Floor(System):
    """Not a system: the ceiling of any fp32 decode on this machine. Each step reads every weight matrix of the model
    once (batch 1 and 4 decode are bound by that: 160 MB per token for the issue's Llama); here ONNX Runtime runs
    only those MatMuls ([batch, in] x [in, out], each matrix once, on its own input), nothing else, as a step. Its
    tokens/s is what a decode step could reach if everything but reading the weights were free."""

    name = "floor"

    def __init__(self, model: torch.nn.Module) -> None:
        self.matrices = [
            module.weight.detach().T.contiguous().numpy()
            for module in model.modules()
            if isinstance(module, torch.nn.Linear)
        ]
        self.session: Any = None
        self.widths: list[int] = []

    def prepare(self, precision: str, threads: int, max_length: int) -> None:
        """A session of the weights' MatMuls with the cell's threads, spinning off."""
        import onnxruntime as ort
        from onnx import TensorProto, helper, numpy_helper

        widths = sorted({int(m.shape[0]) for m in self.matrices})
        nodes, weights, sums = [], [], []
        for i, matrix in enumerate(self.matrices):
            weights.append(numpy_helper.from_array(matrix, f"w{i}"))
            nodes.append(helper.make_node("MatMul", [f"x{matrix.shape[0]}", f"w{i}"], [f"y{i}"]))
            nodes.append(helper.make_node("ReduceSum", [f"y{i}"], [f"s{i}"], keepdims=0))
            sums.append(f"s{i}")
        nodes.append(helper.make_node("Sum", sums, ["out"]))
        inputs = [helper.make_tensor_value_info(f"x{w}", TensorProto.FLOAT, ["batch", w]) for w in widths]
        output = helper.make_tensor_value_info("out", TensorProto.FLOAT, [])
        graph = helper.make_graph(nodes, "weights", inputs, [output], weights)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        self.widths = widths

    def generate(self, ids: np.ndarray) -> Run:
        """NEW steps of the weight-reading graph (tokens: zeros; prefill: not measured)."""
        batch = ids.shape[0]
        feed = {f"x{w}": np.ones((batch, w), np.float32) for w in self.widths}
        start = time.perf_counter()
        for _ in range(NEW - 1):
            self.session.run(None, feed)
        return Run(np.zeros((batch, NEW), np.int64), float("nan"), time.perf_counter() - start)

    def close(self) -> None:
        """The session."""
        self.session = None


class Eager(System):
    """PyTorch eager ``model.generate`` (greedy, transformers' DynamicCache)."""

    name = "eager"

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def prepare(self, precision: str, threads: int, max_length: int) -> None:
        """PyTorch's intra-op threads."""
        torch.set_num_threads(threads)

    def generate(self, ids: np.ndarray) -> Run:
        """``model.generate`` with a stamping streamer."""
        prompt = torch.from_numpy(ids)
        streamer = StampingStreamer()
        with torch.inference_mode():
            start = time.perf_counter()
            out = self.model.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=NEW,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
                streamer=streamer,
            )
        stamps = streamer.stamps
        return Run(out[:, ids.shape[1] :].numpy(), stamps[0] - start, stamps[-1] - stamps[0])


# ---------------------------------------------------------------------------------------------------- helpers


def graph_facts(path: Path) -> dict[str, Any]:
    """Node counts of an ONNX graph and its MatMulNBits settings (accuracy level, block size, bits)."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    ops: dict[str, int] = {}
    for node in graph.node:
        ops[node.op_type] = ops.get(node.op_type, 0) + 1
    facts: dict[str, Any] = {"nodes": len(graph.node), "ops": dict(sorted(ops.items(), key=lambda kv: -kv[1]))}
    nbits = [n for n in graph.node if n.op_type == "MatMulNBits"]
    if nbits:
        settings = set()
        for node in nbits:
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            settings.add((attrs.get("accuracy_level", 0), attrs.get("block_size"), attrs.get("bits")))
        facts["matmulnbits"] = [
            {"count": len(nbits), "accuracy_level": level, "block_size": block, "bits": bits}
            for level, block, bits in sorted(settings)
        ]
    return facts


def agreement(tokens: np.ndarray, reference: np.ndarray) -> dict[str, Any]:
    """How far each row agrees with the reference: its leading identical tokens (the first divergence changes the
    rest), the fewest over the rows, and whether all are identical."""
    prefix = []
    for row, ref in zip(tokens, reference, strict=True):
        differ = np.nonzero(row != ref)[0]
        prefix.append(int(differ[0]) if len(differ) else len(row))
    return {"identical": bool((tokens == reference).all()), "leading_min": min(prefix), "leading": prefix}


def median(values: Sequence[float]) -> float:
    """The median."""
    return float(statistics.median(values))


def versions() -> dict[str, str]:
    """Versions of what this process runs, and the repository's commit."""
    found = {}
    for name in ("torch", "transformers", "onnxruntime", "onnxruntime-genai", "onnx", "numpy"):
        with contextlib.suppress(Exception):  # an optional detail
            found[name] = metadata.version(name)
    with contextlib.suppress(Exception):  # an optional detail
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
        found["repository"] = commit.stdout.strip()
        status = subprocess.run(["git", "status", "--short"], capture_output=True, text=True, cwd=ROOT)
        found["uncommitted"] = " ".join(line[3:] for line in status.stdout.splitlines())  # what else ran as ours
    return found


def timed_alternately(measures: dict[str, Callable[[], float]], runs: int) -> dict[str, dict[str, Any]]:
    """Each measure once per round, in turn, ``runs`` rounds: the median and every value."""
    values: dict[str, list[float]] = {name: [] for name in measures}
    for _ in range(runs):
        for name, measure in measures.items():
            try:
                values[name].append(measure())
            except Exception as error:  # noqa: BLE001 -- recorded, the rest goes on
                log(f"{name} failed: {error}")
    return {
        name: {"median_s": median(v), "runs_s": [round(x, 4) for x in v]} if v else {"error": "failed"}
        for name, v in values.items()
    }


# ---------------------------------------------------------------------------------------------------- the run


def run_cell(systems: dict[str, System], ids: np.ndarray, runs: int, cell: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """One warm-up run per system, then ``runs`` rounds of every system in turn; the medians and all runs."""
    results: dict[str, dict[str, Any]] = {}
    timed: dict[str, list[Run]] = {name: [] for name in systems}
    for round_ in range(runs + 1):
        for name, system in systems.items():
            if "error" in results.get(name, {}):
                continue
            try:
                with quiet_gc():
                    run = system.generate(ids)
            except Exception as error:  # noqa: BLE001 -- recorded, the other systems go on
                log(f"{name} failed at {cell}: {error}")
                traceback.print_exc(file=sys.stderr)
                results[name] = {"error": f"{type(error).__name__}: {error}"}
                continue
            if run.tokens.shape != (ids.shape[0], NEW):
                results[name] = {"error": f"made tokens of shape {list(run.tokens.shape)}, not {[ids.shape[0], NEW]}"}
                continue
            if round_ > 0:  # round 0 warms up
                timed[name].append(run)
    for name, done in timed.items():
        if name in results or not done:
            continue
        tokens = done[0].tokens
        results[name] = {
            "decode_tok_s": median([r.decode_tok_s for r in done]),
            "prefill_ms": 1000 * median([r.prefill_s for r in done]),
            "step_ms": 1000 * median([r.decode_s for r in done]) / (NEW - 1),
            "runs": [
                {"decode_tok_s": round(r.decode_tok_s, 2), "prefill_ms": round(1000 * r.prefill_s, 2)} for r in done
            ],
            "deterministic": all((r.tokens == tokens).all() for r in done),
            "tokens": tokens.tolist(),
        }
    return results


def compare_tokens(precision: str, results: dict[str, dict[str, Any]], reference: np.ndarray) -> list[str]:
    """Record each system's agreement (fp32: with eager's fp32 tokens; int4: ours with GenAI's, and both with eager's
    fp32 for information); the lines to print."""
    lines = []
    genai = results.get("genai", {}).get("tokens")
    for name, result in results.items():
        if "tokens" not in result or name == "floor":  # the floor decodes nothing
            continue
        tokens = np.asarray(result["tokens"])
        result["vs_eager_fp32"] = agreement(tokens, reference)
        if precision == "int4" and name == "ours" and genai is not None:
            result["vs_genai_int4"] = agreement(tokens, np.asarray(genai))
    for name, result in results.items():
        if "vs_eager_fp32" not in result:
            continue
        against = "vs_genai_int4" if precision == "int4" and name == "ours" else "vs_eager_fp32"
        if precision == "int4" and name == "genai":
            continue
        check = result.get(against, result["vs_eager_fp32"])
        what = "GenAI's int4" if against == "vs_genai_int4" else "PyTorch eager's fp32"
        verdict = "identical" if check["identical"] else f"DIFFERENT (leading identical per row {check['leading']})"
        lines.append(f"  {name} greedy tokens vs {what}: {verdict}")
    return lines


def convert_child(spec: dict[str, Any]) -> None:
    """``--convert-child``: one conversion of the checkpoint, timed, saved; its record as the last line of stdout."""
    model = transformers.LlamaForCausalLM.from_pretrained(spec["checkpoint"], dtype=torch.float32).eval()
    ids = torch.from_numpy(prompts()[:1])
    settings = spec["settings"]
    with quiet_gc():
        start = time.perf_counter()
        module = pipeline.convert(
            model, ids, generation={"max_length": spec["max_length"], "max_batch": MAX_BATCH}, **settings
        )
        seconds = time.perf_counter() - start
    path = Path(spec["out"])
    module.save(path)
    record: dict[str, Any] = {
        "seconds": seconds,
        "stages": {name: round(s, 3) for name, s in module.report.stages},
        "settings": settings,
        "artifact_mb": path.stat().st_size / 2**20,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    quantization = getattr(module.report, "quantization", None)
    if quantization is not None:
        with contextlib.suppress(Exception):  # an optional detail
            record["quantization"] = quantization.summary_lines()[0]
    print(json.dumps(record))


def main() -> None:
    """Parse the flags, build everything, run the cells, print the tables, write the JSON."""
    if len(sys.argv) == 3 and sys.argv[1] == "--convert-child":
        convert_child(json.loads(sys.argv[2]))
        return
    if len(sys.argv) == 3 and sys.argv[1] == "--tables":  # the tables of a saved run
        saved = json.loads(Path(sys.argv[2]).read_text())
        print(tables(saved))
        start, end = saved["load_average_start"], saved.get("load_average_end", [float("nan")] * 3)
        print(
            f"load average at start: {' '.join(f'{x:.2f}' for x in start)}; at end: {' '.join(f'{x:.2f}' for x in end)}"
        )
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="timed runs per system and cell (median), default 3")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 4], choices=range(1, MAX_BATCH + 1))
    parser.add_argument("--max-length", type=int, nargs="+", default=[256, 2048, 8192])
    parser.add_argument("--precision", nargs="+", default=list(PRECISIONS), choices=PRECISIONS)
    parser.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated subset of {','.join(SYSTEMS)}")
    parser.add_argument(
        "--int4-accuracy-level",
        type=int,
        default=4,
        choices=(1, 2, 3, 4),
        help="MatMulNBits accuracy level of both int4 columns (ours: ort_int4_accuracy_level; GenAI: accuracy_level); "
        "default 4, GenAI's default for the CPU",
    )
    parser.add_argument(
        "--int4-block-size", type=int, default=32, help="int4 block size of both (default 32, GenAI's default)"
    )
    parser.add_argument(
        "--validate-up-to",
        type=int,
        default=2048,
        help="ours is converted with its default validation up to this max_length, above it with validate=False "
        "(default 2048: at 8192 the validation ran out of this machine's 24 GB after 20 minutes); 0: never",
    )
    parser.add_argument("--no-validate", action="store_true", help="--validate-up-to 0")
    parser.add_argument(
        "--memory-gb", type=float, default=18.0, help="address-space cap of each conversion process (default 18)"
    )
    parser.add_argument("--tiny", action="store_true", help="a tiny model of the same vocabulary: checks the harness")
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="keep the artifacts and GenAI builds already in --work (the same seeded checkpoint) instead of "
        "converting again: decode and load cells only, the conversion table says 'reused'",
    )
    parser.add_argument("--optimum-python", type=Path, default=OPTIMUM_PYTHON, help="the python of optimum's venv")
    parser.add_argument("--work", type=Path, default=None, help="where the checkpoint and artifacts go (kept)")
    parser.add_argument(
        "--json",
        type=Path,
        default=None,
        help="the JSON of every cell (default benchmarks/results/bench_generate_<date>.json; none with --tiny)",
    )
    args = parser.parse_args()
    if args.reuse and args.work is None:
        parser.error("--reuse needs --work (the directory of an earlier run)")
    chosen = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = set(chosen) - set(SYSTEMS)
    if unknown:
        parser.error(f"unknown systems {sorted(unknown)}; choose from {','.join(SYSTEMS)}")
    if any(length < PROMPT + NEW for length in args.max_length):
        parser.error(f"--max-length must hold the prompt and the new tokens: at least {PROMPT + NEW}")
    load_start = os.getloadavg()
    print(
        f"load average at start: {load_start[0]:.2f} {load_start[1]:.2f} {load_start[2]:.2f} on {os.cpu_count()} CPUs"
    )
    work = args.work or Path(tempfile.mkdtemp(prefix="bench_generate_"))
    work.mkdir(parents=True, exist_ok=True)
    started = datetime.datetime.now()
    int4_ours = {
        "precision": "int4",
        "quantize_fallback": "fp32",  # GenAI's -p int4 -e cpu computes in float32 around its 4-bit MatMuls
        "keep_head": False,  # and quantizes the head as every other MatMul
        "block_size": args.int4_block_size,
        "ort_int4_accuracy_level": args.int4_accuracy_level,
    }
    int4_genai = {"accuracy_level": args.int4_accuracy_level, "block_size": args.int4_block_size}
    record: dict[str, Any] = {
        "started": started.isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "load_average_start": load_start,
        "model": {**(TINY if args.tiny else MODEL), "vocab_size": VOCAB, "max_position_embeddings": 8192},
        "prompt_tokens": PROMPT,
        "new_tokens": NEW,
        "runs": args.runs,
        "int4": {"ours": int4_ours, "genai_extra_options": int4_genai},
        "versions": versions(),
        "skipped": {},
        "conversion": {},
        "load": {},
        "cells": [],
    }

    checkpoint = work / "checkpoint"
    log(f"building the checkpoint in {checkpoint}")
    build_checkpoint(checkpoint, TINY if args.tiny else MODEL)
    model = transformers.LlamaForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    systems = make_systems(chosen, model, checkpoint, work, args, int4_ours, int4_genai, record)
    reference = eager_reference(model, args.threads[0])

    convert_all(systems, args, record)
    measure_loads(systems, args, record)

    ids_all = prompts()
    for threads in args.threads:
        for precision in args.precision:
            for max_length in args.max_length:
                active = {
                    name: system
                    for name, system in systems.items()
                    if name in RUNS_AT[precision] and ready(system, precision, max_length)
                }
                for name, system in list(active.items()):
                    try:
                        system.prepare(precision, threads, max_length)
                    except Exception as error:  # noqa: BLE001 -- recorded, the others go on
                        log(f"{name} could not prepare {precision} {max_length} threads {threads}: {error}")
                        del active[name]
                for batch in args.batch:
                    cell = {"precision": precision, "threads": threads, "max_length": max_length, "batch": batch}
                    log(f"cell {cell}: {', '.join(active)}")
                    cell["load_1m_start"] = os.getloadavg()[0]
                    results = run_cell(active, ids_all[:batch], args.runs, cell)
                    cell["load_1m_end"] = os.getloadavg()[0]
                    own = results.get("eager", {}).get("tokens")  # eager's own run of this batch, where it ran
                    fp32 = np.asarray(own) if own is not None else reference[:batch]
                    lines = compare_tokens(precision, results, fp32)
                    print(f"{cell}:", flush=True)
                    for name, result in results.items():
                        summary = (
                            f"decode {result['decode_tok_s']:.1f} tok/s, prefill {result['prefill_ms']:.0f} ms"
                            if "decode_tok_s" in result
                            else result.get("error", "")
                        )
                        print(f"  {name}: {summary}", flush=True)
                    print("\n".join(lines), flush=True)
                    record["cells"].append({**cell, "systems": results})
                for system in active.values():
                    if system.name != "optimum":  # the worker keeps its model between cells of the same threads
                        system.close()
    for system in systems.values():
        with contextlib.suppress(Exception):  # an optional detail
            system.close()
    load_end = os.getloadavg()
    record["load_average_end"] = load_end
    record["finished"] = datetime.datetime.now().isoformat(timespec="seconds")
    print()
    print(tables(record))
    for name, why in record["skipped"].items():
        print(f"SKIPPED {name}: {why}")
    print(
        f"load average at start: {load_start[0]:.2f} {load_start[1]:.2f} {load_start[2]:.2f}; "
        f"at end: {load_end[0]:.2f} {load_end[1]:.2f} {load_end[2]:.2f} on {os.cpu_count()} CPUs"
    )
    path = args.json
    if path is None and not args.tiny:
        path = ROOT / "benchmarks" / "results" / f"bench_generate_{started.date().isoformat()}.json"
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=1, default=str) + "\n")
        print(f"JSON of every cell: {path}")
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)


def make_systems(
    chosen: list[str],
    model: torch.nn.Module,
    checkpoint: Path,
    work: Path,
    args: argparse.Namespace,
    int4_ours: dict[str, Any],
    int4_genai: dict[str, int],
    record: dict[str, Any],
) -> dict[str, System]:
    """The chosen systems that can run here, in SYSTEMS order; the others recorded as skipped, with why."""
    systems: dict[str, System] = {}
    for name in SYSTEMS:
        if name not in chosen:
            continue
        try:
            if name == "ours":
                validate_up_to = 0 if args.no_validate else args.validate_up_to
                systems[name] = Ours(checkpoint, work, validate_up_to, int4_ours, args.memory_gb)
            elif name == "genai":
                systems[name] = GenAI(checkpoint, work, int4_genai)
            elif name == "optimum":
                if not args.optimum_python.exists():
                    raise FileNotFoundError(
                        f"no optimum venv at {args.optimum_python}; create it (benchmarks/peers/optimum_worker.py): "
                        "python3 -m venv /work/bench-venvs/optimum && /work/bench-venvs/optimum/bin/pip install "
                        "torch==2.13.0 && /work/bench-venvs/optimum/bin/pip install 'optimum-onnx[onnxruntime]==0.1.0'"
                        ", or pass --optimum-python"
                    )
                optimum = Optimum(args.optimum_python, checkpoint, work)
                record["versions"]["optimum venv"] = optimum.versions()
                systems[name] = optimum
            elif name == "floor":
                systems[name] = Floor(model)
            else:
                systems[name] = Eager(model)
        except Exception as error:  # noqa: BLE001 -- a missing peer skips its column, with the reason
            if name == "genai":
                error = RuntimeError(f"{error} (install it: pip install onnxruntime-genai, or .[genai])")
            record["skipped"][name] = str(error)
            print(f"SKIPPED {name}: {error}", flush=True)
    return systems


def ready(system: System, precision: str, max_length: int) -> bool:
    """Whether the system's artifact for the cell was built."""
    if isinstance(system, Ours):
        return (precision, max_length) in system.artifacts
    if isinstance(system, GenAI):
        return precision in system.built
    if isinstance(system, Optimum):
        return system.out.exists()
    return True


def eager_reference(model: torch.nn.Module, threads: int) -> np.ndarray:
    """PyTorch eager's fp32 greedy tokens of all the prompts (the int4 cells' reference, where eager does not run)."""
    torch.set_num_threads(threads)
    return Eager(model).generate(prompts()).tokens


def convert_all(systems: dict[str, System], args: argparse.Namespace, record: dict[str, Any]) -> None:
    """Each system's conversion, timed: GenAI's builder per precision, ours per precision and max_length,
    optimum's export once."""
    conversion = record["conversion"]
    for precision in args.precision:
        genai = systems.get("genai")
        if isinstance(genai, GenAI) and args.reuse and (args.work / f"genai_{precision}" / "model.onnx").exists():
            genai.built[precision] = args.work / f"genai_{precision}"
            conversion[f"genai {precision}"] = {"reused": str(genai.built[precision])}
        elif isinstance(genai, GenAI):
            log(f"GenAI builder, {precision}")
            try:
                conversion[f"genai {precision}"] = genai.build(precision)
            except Exception as error:  # noqa: BLE001
                conversion[f"genai {precision}"] = {"error": str(error)}
                log(f"GenAI builder failed: {error}")
        ours = systems.get("ours")
        if isinstance(ours, Ours):
            for max_length in args.max_length:
                log(f"ours: convert {precision} max_length {max_length}")
                key = f"ours {precision} max_length {max_length}"
                kept = args.work / f"ours_{precision}_{max_length}.ptrt" if args.reuse else None
                if kept is not None and kept.exists():
                    ours.artifacts[precision, max_length] = kept
                    conversion[key] = {"reused": str(kept)}
                    continue
                try:
                    conversion[key] = ours.convert(precision, max_length)
                except Exception as error:  # noqa: BLE001
                    conversion[key] = {"error": f"{type(error).__name__}: {error}"}
                    traceback.print_exc(file=sys.stderr)
                if "error" in conversion[key]:
                    log(f"ours failed to convert: {conversion[key]['error'][-1500:]}")
                elif "seconds" in conversion[key]:
                    log(f"ours converted in {conversion[key]['seconds']:.1f} s: {conversion[key]['stages']}")
    optimum = systems.get("optimum")
    if isinstance(optimum, Optimum) and "fp32" in args.precision:
        log("optimum export")
        try:
            conversion["optimum fp32"] = optimum.export()
        except Exception as error:  # noqa: BLE001
            conversion["optimum fp32"] = {"error": str(error)}
            log(f"optimum export failed: {error}")


def measure_loads(systems: dict[str, System], args: argparse.Namespace, record: dict[str, Any]) -> None:
    """Loading, alternately and ``--runs`` times: our artifacts against ``og.Model``, in this process (at the first
    --threads) and in a fresh process (imports included); optimum's load at the same threads."""
    threads = args.threads[0]
    ours, genai, optimum = systems.get("ours"), systems.get("genai"), systems.get("optimum")
    for precision in args.precision:
        measures: dict[str, Callable[[], float]] = {}
        if isinstance(ours, Ours):
            for max_length in args.max_length:
                if (precision, max_length) in ours.artifacts:
                    measures[f"ours {precision} max_length {max_length}"] = _loader(
                        ours, precision, max_length, threads
                    )
        if isinstance(genai, GenAI) and precision in genai.built:
            measures[f"genai {precision}"] = _genai_loader(genai, precision, threads)
        if isinstance(optimum, Optimum) and precision == "fp32" and optimum.out.exists():
            measures["optimum fp32"] = lambda: optimum.load(threads)
        if measures:
            log(f"loading, {precision}")
            record["load"].update(timed_alternately(measures, args.runs))
        cold: dict[str, Callable[[], float]] = {}
        if isinstance(ours, Ours) and (precision, args.max_length[0]) in ours.artifacts:
            length = args.max_length[0]
            cold[f"ours {precision} max_length {length}, fresh process"] = lambda p=precision, n=length: ours.cold_load(
                p, n, threads
            )
        if isinstance(genai, GenAI) and precision in genai.built:
            cold[f"genai {precision}, fresh process"] = lambda p=precision: genai.cold_load(p, threads)
        if cold:
            record["load"].update(timed_alternately(cold, args.runs))
    if isinstance(optimum, Optimum):
        optimum.threads = threads


def _loader(ours: Ours, precision: str, max_length: int, threads: int) -> Callable[[], float]:
    """A measure of ``pipeline.load`` of one artifact."""

    def measure() -> float:
        module, seconds = ours.load(precision, max_length, threads)
        del module
        return seconds

    return measure


def _genai_loader(genai: GenAI, precision: str, threads: int) -> Callable[[], float]:
    """A measure of ``og.Model``."""

    def measure() -> float:
        model, seconds = genai.load(precision, threads)
        del model
        return seconds

    return measure


# ---------------------------------------------------------------------------------------------------- tables


def tables(record: dict[str, Any]) -> str:
    """The Markdown tables: every cell, ours against GenAI, conversion and loading."""
    out = []
    batches = sorted({c["batch"] for c in record["cells"]})
    head = ["precision", "threads", "max_length", "system"]
    head += [f"decode tok/s b{b}" for b in batches] + [f"prefill ms b{b}" for b in batches] + ["greedy tokens"]
    out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    groups: dict[tuple[str, int, int], dict[int, dict[str, Any]]] = {}
    for cell in record["cells"]:
        groups.setdefault((cell["precision"], cell["threads"], cell["max_length"]), {})[cell["batch"]] = cell
    for (precision, threads, max_length), by_batch in groups.items():
        names = [n for n in SYSTEMS if any(n in c["systems"] for c in by_batch.values())]
        for name in names:
            results = [by_batch[b]["systems"].get(name, {}) if b in by_batch else {} for b in batches]
            row = [precision, str(threads), str(max_length), name]
            row += [f"{r['decode_tok_s']:.1f}" if "decode_tok_s" in r else "failed" for r in results]
            row += [f"{r['prefill_ms']:.0f}" if "prefill_ms" in r else "failed" for r in results]
            row.append(_token_verdict(precision, name, results))
            out.append("| " + " | ".join(row) + " |")
    out.append("")
    out += _ratios(groups, batches)
    out.append("")
    out += _conversion_table(record)
    return "\n".join(out)


def _token_verdict(precision: str, name: str, results: list[dict[str, Any]]) -> str:
    """'identical' or the fewest leading identical tokens, against the column's reference."""
    key = "vs_genai_int4" if precision == "int4" and name == "ours" else "vs_eager_fp32"
    what = "GenAI int4" if key == "vs_genai_int4" else "eager fp32"
    if precision == "int4" and name == "genai":
        key, what = "vs_eager_fp32", "eager fp32 (info)"
    checks = [r[key] for r in results if key in r]
    if not checks:
        return "n/a"
    if name == "eager" and precision == "fp32":
        return "reference" if all(c["identical"] for c in checks) else "reference (run-to-run differences)"
    if all(c["identical"] for c in checks):
        return f"= {what}"
    return f"{min(c['leading_min'] for c in checks)}/{NEW} leading = {what}"


def _ratios(groups: dict[tuple[str, int, int], dict[int, dict[str, Any]]], batches: list[int]) -> list[str]:
    """Ours against GenAI per cell: decode tokens/s ratio and prefill speed ratio (GenAI's ms / ours)."""
    head = ["precision", "threads", "max_length"]
    head += [f"ours/GenAI decode b{b}" for b in batches] + [f"ours/GenAI prefill speed b{b}" for b in batches]
    head += [f"floor/GenAI decode b{b}" for b in batches]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (precision, threads, max_length), by_batch in groups.items():
        decode, prefill, ceiling = [], [], []
        for b in batches:
            systems = by_batch.get(b, {}).get("systems", {})
            ours, genai, floor = systems.get("ours", {}), systems.get("genai", {}), systems.get("floor", {})
            if "decode_tok_s" in ours and "decode_tok_s" in genai:
                decode.append(f"{ours['decode_tok_s'] / genai['decode_tok_s']:.2f}x")
                prefill.append(f"{genai['prefill_ms'] / ours['prefill_ms']:.2f}x")
            else:
                decode.append("n/a")
                prefill.append("n/a")
            has = "decode_tok_s" in floor and "decode_tok_s" in genai
            ceiling.append(f"{floor['decode_tok_s'] / genai['decode_tok_s']:.2f}x" if has else "n/a")
        row = [precision, str(threads), str(max_length), *decode, *prefill, *ceiling]
        out.append("| " + " | ".join(row) + " |")
    return out


def _last_line(error: str) -> str:
    """The last line of an error (a traceback's ends with the exception), fit for a table cell."""
    lines = [line.strip() for line in error.strip().splitlines() if line.strip()]
    return (lines[-1] if lines else error)[:200].replace("|", "/")


def _conversion_table(record: dict[str, Any]) -> list[str]:
    """Conversion seconds and load seconds."""
    out = ["| what | conversion s | artifact MB | notes |", "|---|---|---|---|"]
    for name, conv in record["conversion"].items():
        if "error" in conv:
            out.append(f"| {name} | failed | | {_last_line(conv['error'])} |")
            continue
        if "reused" in conv:
            out.append(f"| {name} | reused | | from {conv['reused']} (--reuse: not converted in this run) |")
            continue
        notes = []
        if "default_conversion_error" in conv:
            notes.append(
                f"DEFAULT CONVERSION FAILED ({_last_line(conv['default_conversion_error'])}); timed: validate=False"
            )
        elif conv.get("settings", {}).get("validate") is False:
            notes.append("validate=False")
        if "peak_rss_mb" in conv:
            notes.append(f"peak RSS {conv['peak_rss_mb']:.0f} MB")
        if "stages" in conv:
            notes.append(", ".join(f"{k} {v:.1f}" for k, v in conv["stages"].items()))
        for nbits in conv.get("matmulnbits", []):
            notes.append(
                f"{nbits['count']} MatMulNBits, accuracy_level {nbits['accuracy_level']}, "
                f"block {nbits['block_size']}, {nbits['bits']} bits"
            )
        if "quantization" in conv:
            notes.append(conv["quantization"])
        size = f"{conv['artifact_mb']:.0f}" if "artifact_mb" in conv else ""
        out.append(f"| {name} | {conv['seconds']:.1f} | {size} | {'; '.join(notes)} |")
    out += ["", "| load | median s | runs s |", "|---|---|---|"]
    for name, load in record["load"].items():
        if "median_s" in load:
            out.append(f"| {name} | {load['median_s']:.3f} | {', '.join(f'{x:.3f}' for x in load['runs_s'])} |")
        else:
            out.append(f"| {name} | failed | |")
    return out


if __name__ == "__main__":
    main()
