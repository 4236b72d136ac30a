"""Benchmark ``pipeline.serve``: a model served by a real Triton Inference Server against direct calls of the loaded
artifact from one thread, for a small ResNet-style CNN and a BERT-style encoder, with and without dynamic batching.

Every request is one row (a 3x64x64 image; 64 tokens with their mask and token types), sent by 1, 4 and 16
concurrent clients: threads of this process, each with its own ``tritonclient`` client (gRPC by default). The
direct side is ``pipeline.load(path, threads=T)`` called like the model, one row at a time, from one thread, and
the same module called on 8 rows (what the batcher can gather at most: the ceiling of batching). The servers run
the artifact in Triton's Python backend with the same ``threads=T`` ONNX Runtime intra-op threads per instance.

Each server variant (no batching; dynamic batching with ``--delay-us`` and ``--max-batch``; each at every
``--instances``) is started once and serves both models for the whole run. Then ``--rounds`` rounds, each running
every (model, clients, variant) segment and the direct segments, the order rotating between rounds, so that a
change of the machine's load falls on all of them alike. A segment is ``--warmup`` untimed requests per client,
then ``--seconds`` of requests (those in flight at the end are waited for and counted). Every answer is compared
with the direct call on the same row (``--rtol``/``--atol``); wrong answers, errors and lost requests are counted
and must all be zero. Triton's own statistics give the rows per execution (the batches formed), the time requests
waited in its queue and the backend's time per execution; the CPU seconds of the clients (this process) and of the
server (``tritonserver`` and its backend stubs) are read per segment.

Run from the repository root::

    python benchmarks/bench_serve.py                   # full run, about 7 minutes on 2 cores
    python benchmarks/bench_serve.py --quick           # smoke run, about 2 minutes (half of it converting)
    python benchmarks/bench_serve.py --models cnn --clients 16 --instances 1,2 --delay-us 500,2000
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pipeline  # noqa: E402
from converters.files import write_file_atomically  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "serve_newest.json"
BATCH_DIM = ("batch", 1, 8, 16)  # (name, min, opt, max) of the converted batch dimension
GOAL_RATIO = 1.5  # the goal: dynamic batching at 16 clients >= 1.5x the server without it
POOL = 32  # distinct rows per model; request i of a client sends row (client + i) % POOL
# Triton counts a request in its statistics just after sending its response: a read right after the last answer
# can miss it (measured: off by 1-2 requests per segment without this pause, either way)
SETTLE_S = 0.2
CNN_INPUT = "x"  # the graph input of examples/cnn.py, named after forward's argument


@dataclass
class Case:
    """A converted model: its artifact, the rows the clients send and the direct call's answers for them."""

    name: str
    description: str
    path: Path
    module: Any
    rows: list[dict[str, np.ndarray]]  # graph input name -> array with a batch dimension of 1
    expected: list[dict[str, np.ndarray]]  # graph output name -> the direct call's answer
    call: Callable[[dict[str, np.ndarray]], Any]  # the direct call, model-shaped, on torch tensors

    @property
    def outputs(self) -> list[str]:
        return [spec.name for spec in self.module.io.outputs]


@dataclass
class Segment:
    """One timed stretch: requests answered, wall seconds, each request's latency and what went wrong."""

    requests: int = 0
    rows: int = 0
    seconds: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    sent: int = 0
    wrong: int = 0
    errors: int = 0
    max_abs_diff: float = 0.0
    client_cpu_s: float = 0.0
    server_cpu_s: float = 0.0
    triton: dict[str, float] = field(default_factory=dict)
    first_error: str = ""

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds else 0.0


@dataclass(frozen=True)
class Variant:
    """A server configuration."""

    dynamic_batching: bool
    instances: int
    delay_us: int

    @property
    def name(self) -> str:
        batching = f"dynamic batching {self.delay_us} us" if self.dynamic_batching else "no batching"
        return f"{batching}, {self.instances} inst."


# --- the models ------------------------------------------------------------------------------------------------------


def _define_torchvision_ops() -> None:
    """transformers imports torchvision when it is installed, whose ops need these schemas (no torchvision library
    in this environment); defined before ``import transformers``."""
    for op, schema in (
        ("nms", "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor"),
        ("qnms", "(Tensor dets, Tensor scores, Tensor qscores, float iou_threshold) -> Tensor"),
    ):
        with suppress(RuntimeError):  # already defined (by torchvision itself, or a second call)
            torch.library.define(f"torchvision::{op}", schema)


def convert_cnn(path: Path, **settings: Any) -> Path:
    """``examples/cnn.py:build`` (a small ResNet, 3x64x64 images) with a dynamic batch dimension."""
    from examples.cnn import build

    model, sample = build()
    module = pipeline.convert(model, sample, dynamic={CNN_INPUT: {0: BATCH_DIM}}, **settings)
    assert [t.name for t in module.io.inputs] == [CNN_INPUT], module.io.inputs
    return module.save(path)


BERT: dict[str, Any] = {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 1024}
SEQ = 64
BERT_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def convert_bert(path: Path, **settings: Any) -> Path:
    """A random ``BertModel`` (``BERT``), ``SEQ`` tokens, the three inputs sharing one dynamic batch dimension."""
    _define_torchvision_ops()
    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(**BERT)
    model = transformers.BertModel(config).eval()
    sample = _bert_rows(2, torch.Generator().manual_seed(0))
    dynamic = {name: {0: BATCH_DIM} for name in BERT_INPUTS}
    module = pipeline.convert(model, ((), sample), dynamic=dynamic, **settings)
    return module.save(path)


def _bert_rows(count: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    ids = torch.randint(1, 30000, (count, SEQ), generator=generator)
    mask = torch.ones_like(ids)
    for row in range(count):  # some padding, of a different length in each row
        pad = int(torch.randint(0, SEQ // 2, (1,), generator=generator))
        if pad:
            mask[row, SEQ - pad :] = 0
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}


CONVERTERS = {"cnn": convert_cnn, "bert": convert_bert}
DESCRIPTIONS = {
    "cnn": "examples/cnn.py SmallResNet, 1x3x64x64 per request",
    "bert": "BertModel hidden {hidden_size}, {num_hidden_layers} layers, {num_attention_heads} heads, "
    "seq {seq}, 1 row per request".format(seq=SEQ, **BERT),
}


def make_case(name: str, path: Path, threads: int) -> Case:
    """Load the artifact as the direct side uses it and answer every row of the pool with it."""
    module = pipeline.load(path, threads=threads)
    generator = torch.Generator().manual_seed(1)
    rows: list[dict[str, np.ndarray]] = []
    for _ in range(POOL):
        if name == "cnn":
            tensors = {CNN_INPUT: torch.randn(1, 3, 64, 64, generator=generator)}
        else:
            tensors = _bert_rows(1, generator)
        rows.append({key: value.numpy() for key, value in tensors.items()})
    inputs = [spec.name for spec in module.io.inputs]
    outputs = [spec.name for spec in module.io.outputs]
    expected = []
    for row in rows:
        answers = module.run_flat([torch.from_numpy(row[key]) for key in inputs])
        expected.append({key: value.numpy().copy() for key, value in zip(outputs, answers, strict=True)})
    if name == "cnn":
        call: Callable[[dict[str, np.ndarray]], Any] = lambda row: module(torch.from_numpy(row[CNN_INPUT]))  # noqa: E731
    else:
        call = lambda row: module(**{k: torch.from_numpy(v) for k, v in row.items()})  # noqa: E731
    return Case(name, DESCRIPTIONS[name], path, module, rows, expected, call)


def _flat(case: Case, answer: Any) -> dict[str, np.ndarray]:
    """The direct call's model-shaped answer (a tensor, or transformers' ``ModelOutput``) by graph output name."""
    if isinstance(answer, torch.Tensor):
        return {case.outputs[0]: answer.numpy()}
    return {name: answer[name].numpy() for name in case.outputs}


def _compare(got: dict[str, np.ndarray], expected: dict[str, np.ndarray], rtol: float, atol: float) -> float | None:
    """The largest absolute difference, or None when an output is missing, misshapen or outside the tolerance."""
    worst = 0.0
    for name, want in expected.items():
        have = got.get(name)
        if have is None or have.shape != want.shape:
            return None
        diff = np.abs(have - want)
        if not np.all(diff <= atol + rtol * np.abs(want)):
            return None
        worst = max(worst, float(diff.max()))
    return worst


# --- the direct side -------------------------------------------------------------------------------------------------


def direct_segment(case: Case, seconds: float, warmup: int, batch: int, rtol: float, atol: float) -> Segment:
    """The loaded artifact called from one thread, ``batch`` rows per call, for ``seconds``."""
    if batch == 1:
        calls = case.rows
        wanted = case.expected
    else:
        calls = [
            {key: np.concatenate([case.rows[(i + j) % POOL][key] for j in range(batch)]) for key in case.rows[0]}
            for i in range(POOL)
        ]
        wanted = [
            {key: np.concatenate([case.expected[(i + j) % POOL][key] for j in range(batch)]) for key in case.outputs}
            for i in range(POOL)
        ]
    segment = Segment()
    for i in range(warmup):
        case.call(calls[i % POOL])
    cpu = time.process_time()
    start = time.perf_counter()
    deadline = start + seconds
    for i in itertools.count():
        began = time.perf_counter()
        if began >= deadline:
            break
        answer = case.call(calls[i % POOL])
        segment.latencies_ms.append((time.perf_counter() - began) * 1e3)
        segment.sent += 1
        _tally(segment, _flat(case, answer), wanted[i % POOL], rtol, atol, batch)
    segment.seconds = time.perf_counter() - start
    segment.client_cpu_s = time.process_time() - cpu
    return segment


def _tally(
    segment: Segment, got: dict[str, np.ndarray], wanted: dict[str, np.ndarray], rtol: float, atol: float, rows: int
) -> None:
    worst = _compare(got, wanted, rtol, atol)
    segment.requests += 1
    segment.rows += rows
    if worst is None:
        segment.wrong += 1
    else:
        segment.max_abs_diff = max(segment.max_abs_diff, worst)


# --- the served side -------------------------------------------------------------------------------------------------


class Protocol:
    """``tritonclient.grpc`` or ``tritonclient.http``: a client per thread, its inputs built once per row."""

    def __init__(self, name: str) -> None:
        self.name = name
        if name == "grpc":
            import tritonclient.grpc as client
        else:
            import tritonclient.http as client
        self.module = client

    def url(self, server: Any) -> str:
        return str(server.grpc_url if self.name == "grpc" else server.http_url)

    def client(self, server: Any) -> Any:
        return self.module.InferenceServerClient(self.url(server))

    def inputs(self, row: dict[str, np.ndarray]) -> list[Any]:
        made = []
        for key, value in row.items():
            given = self.module.InferInput(key, list(value.shape), "FP32" if value.dtype == np.float32 else "INT64")
            given.set_data_from_numpy(value)
            made.append(given)
        return made

    def statistics(self, client: Any, model: str) -> dict[str, float]:
        """Triton's cumulative counters for ``model``: requests, executions, rows, and nanoseconds per phase."""
        if self.name == "grpc":
            stats = client.get_inference_statistics(model, as_json=True)["model_stats"][0]
        else:
            stats = client.get_inference_statistics(model)["model_stats"][0]
        inference = stats["inference_stats"]

        def number(value: Any) -> float:  # protobuf's JSON leaves out zeros and writes 64-bit integers as text
            return float(value or 0)

        counts = {
            "requests": number(inference.get("success", {}).get("count")),
            "failed": number(inference.get("fail", {}).get("count")),
            "executions": number(stats.get("execution_count")),
            "rows": number(stats.get("inference_count")),
        }
        for phase in ("queue", "compute_input", "compute_infer", "compute_output"):
            counts[f"{phase}_ns"] = number(inference.get(phase, {}).get("ns"))
        return counts


def server_pids(grpc_port: int) -> list[int]:
    """The ``tritonserver`` listening on ``grpc_port`` and its backend stubs (its session: it starts a new one)."""
    leader = None
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                command = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if command and command[0].endswith(b"tritonserver") and f"--grpc-port={grpc_port}".encode() in command:
                leader = int(entry.name)
    if leader is None:
        return []
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields and int(fields[3]) == leader:  # field 6 of stat: the session id
                members.append(int(entry.name))
    return members


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()  # fields from the 3rd on (the command may hold spaces)


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of the processes (all their threads)."""
    ticks = 0
    for pid in pids:
        fields = _stat(pid)
        if fields:
            ticks += int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15
    return ticks / os.sysconf("SC_CLK_TCK")


def served_segment(
    protocol: Protocol,
    server: Any,
    pids: list[int],
    case: Case,
    clients: int,
    seconds: float,
    warmup: int,
    rtol: float,
    atol: float,
) -> Segment:
    """``clients`` threads, each with its own client, sending rows for ``seconds`` after ``warmup`` requests each."""
    segment = Segment()
    lock = threading.Lock()
    # the clients warm up, then wait while Triton's counters and the CPU clocks are read, then go together
    warmed, go = threading.Barrier(clients + 1), threading.Barrier(clients + 1)
    deadline = [0.0]  # set just before the clients go

    def work(index: int) -> None:
        client = protocol.client(server)
        requests = [protocol.inputs(row) for row in case.rows]
        latencies: list[float] = []
        mine = Segment()
        try:
            for i in range(warmup):
                client.infer(case.name, requests[(index + i) % POOL])
        except Exception as err:  # noqa: BLE001 - counted and reported
            mine.errors += 1
            mine.first_error = f"warm-up: {type(err).__name__}: {err}"
        warmed.wait()
        go.wait()
        for i in itertools.count():
            if time.perf_counter() >= deadline[0]:
                break
            position = (index + i) % POOL
            mine.sent += 1
            began = time.perf_counter()
            try:
                result = client.infer(case.name, requests[position])
            except Exception as err:  # noqa: BLE001 - counted and reported
                mine.errors += 1
                mine.first_error = mine.first_error or f"{type(err).__name__}: {err}"
                continue
            latencies.append((time.perf_counter() - began) * 1e3)
            _tally(mine, {name: result.as_numpy(name) for name in case.outputs}, case.expected[position], rtol, atol, 1)
        client.close()
        with lock:
            segment.latencies_ms.extend(latencies)
            segment.sent += mine.sent
            segment.requests += mine.requests
            segment.rows += mine.rows
            segment.wrong += mine.wrong
            segment.errors += mine.errors
            segment.max_abs_diff = max(segment.max_abs_diff, mine.max_abs_diff)
            segment.first_error = segment.first_error or mine.first_error

    watcher = protocol.client(server)
    threads = [threading.Thread(target=work, args=(i,), name=f"client-{i}") for i in range(clients)]
    for thread in threads:
        thread.start()
    warmed.wait()
    time.sleep(SETTLE_S)
    before = protocol.statistics(watcher, case.name)
    cpu_client, cpu_server = time.process_time(), cpu_seconds(pids)
    start = time.perf_counter()
    deadline[0] = start + seconds
    go.wait()
    for thread in threads:
        thread.join()
    segment.seconds = time.perf_counter() - start
    segment.client_cpu_s = time.process_time() - cpu_client
    segment.server_cpu_s = cpu_seconds(pids) - cpu_server
    time.sleep(SETTLE_S)
    after = protocol.statistics(watcher, case.name)
    watcher.close()
    segment.triton = {key: after[key] - before[key] for key in after}
    return segment


# --- the run ---------------------------------------------------------------------------------------------------------


@contextmanager
def collector_off() -> Iterator[None]:
    """No garbage collection inside a timed segment (a collection would land on whichever request it hits)."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def summary(segments: list[Segment]) -> dict[str, Any]:
    """Medians over rounds of throughput; latency percentiles over every request of every round; the totals."""
    latencies = [v for s in segments for v in s.latencies_ms]
    triton = {key: sum(s.triton.get(key, 0.0) for s in segments) for key in (segments[0].triton if segments else {})}
    requests = sum(s.requests for s in segments)
    out: dict[str, Any] = {
        "requests_per_s": statistics.median(s.requests_per_s for s in segments),
        "rows_per_s": statistics.median(s.rows_per_s for s in segments),
        "requests_per_s_rounds": [round(s.requests_per_s, 2) for s in segments],
        "p50_ms": percentile(latencies, 50),
        "p99_ms": percentile(latencies, 99),
        "requests": requests,
        "sent": sum(s.sent for s in segments),
        "wrong": sum(s.wrong for s in segments),
        "errors": sum(s.errors for s in segments),
        "lost": sum(s.sent - s.requests - s.errors for s in segments),
        "max_abs_diff": max((s.max_abs_diff for s in segments), default=0.0),
        "client_cpu_ms_per_request": 1e3 * sum(s.client_cpu_s for s in segments) / max(requests, 1),
        "server_cpu_ms_per_request": 1e3 * sum(s.server_cpu_s for s in segments) / max(requests, 1),
        "first_error": next((s.first_error for s in segments if s.first_error), ""),
    }
    if triton:
        executions, requests_seen = max(triton["executions"], 1.0), max(triton["requests"], 1.0)
        out["triton"] = {
            # every request a client sent is one Triton counted (as answered or failed), and no other
            "counts_match_clients": triton["requests"] + triton["failed"] == out["sent"],
            "requests": triton["requests"],
            "failed": triton["failed"],
            "executions": triton["executions"],
            "rows_per_execution": triton["rows"] / executions,
            "queue_ms_per_request": triton["queue_ns"] / requests_seen / 1e6,
            # Triton gives each request of a batch the whole execution's durations: per request is per execution
            "infer_ms_per_execution": triton["compute_infer_ns"] / requests_seen / 1e6,
            "input_output_ms_per_execution": (triton["compute_input_ns"] + triton["compute_output_ns"])
            / requests_seen
            / 1e6,
        }
    return out


def parse_list(text: str, kind: Callable[[str], Any] = int) -> list[Any]:
    return [kind(part) for part in text.split(",") if part]


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 round of 1.5 s segments")
    parser.add_argument("--models", default="cnn,bert", help="cnn, bert or both (comma-separated)")
    parser.add_argument("--clients", default="1,4,16", help="concurrent client counts")
    parser.add_argument("--rounds", type=int, default=4, help="rounds of all segments (medians over rounds)")
    parser.add_argument("--seconds", type=float, default=4.0, help="timed seconds per segment")
    parser.add_argument("--warmup", type=int, default=3, help="untimed requests per client before each segment")
    parser.add_argument("--threads", type=int, default=2, help="ONNX Runtime intra-op threads, served and direct")
    parser.add_argument("--instances", default="1", help="model instances per server variant (e.g. 1,2)")
    parser.add_argument("--delay-us", default="500", help="max_queue_delay_us of the dynamic batcher (e.g. 500,2000)")
    parser.add_argument("--max-batch", type=int, default=8, help="max_batch of the served models")
    parser.add_argument("--protocol", choices=("grpc", "http"), default="grpc")
    parser.add_argument(
        "--spinning",
        choices=("default", "off"),
        default="default",
        help="ONNX Runtime's intra-op spin-waiting (converted into the artifacts: served and direct alike)",
    )
    parser.add_argument("--rtol", type=float, default=1e-4, help="relative tolerance of a served answer")
    parser.add_argument("--atol", type=float, default=1e-4, help="absolute tolerance of a served answer")
    parser.add_argument("--work", type=Path, help="keep the artifacts here (and reuse them when present)")
    parser.add_argument("--json", type=Path, default=RESULTS, help=f"results file (default {RESULTS})")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.seconds, args.warmup = 1, 1.5, 2
    return args


def variants(args: argparse.Namespace) -> list[Variant]:
    chosen = []
    for instances in parse_list(args.instances):
        chosen.append(Variant(False, instances, 0))
        chosen += [Variant(True, instances, delay) for delay in parse_list(args.delay_us)]
    return chosen


def prepare_cases(args: argparse.Namespace, work: Path) -> dict[str, Case]:
    cases = {}
    for name in parse_list(args.models, str):
        # ONNX Runtime's spin-waiting is a setting of the artifact: the served instances and the direct module follow it
        spinning = {} if args.spinning == "default" else {"spinning": False}
        path = work / (f"{name}.ptrt" if not spinning else f"{name}-nospin.ptrt")
        if not path.is_file():
            started = time.perf_counter()
            CONVERTERS[name](path, **spinning)
            print(f"converted {name} in {time.perf_counter() - started:.0f} s: {path}", flush=True)
        cases[name] = make_case(name, path, args.threads)
    return cases


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    protocol = Protocol(args.protocol)
    clients = parse_list(args.clients)
    began, load_before = time.time(), os.getloadavg()
    with ExitStack() as stack:
        work = args.work or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-serve-")))
        work.mkdir(parents=True, exist_ok=True)
        cases = prepare_cases(args, work)
        servers: dict[Variant, tuple[Any, list[int]]] = {}
        for variant in variants(args):
            started = time.perf_counter()
            server = stack.enter_context(
                pipeline.serve(
                    {name: case.path for name, case in cases.items()},
                    max_batch=args.max_batch,
                    dynamic_batching=variant.dynamic_batching,
                    max_queue_delay_us=variant.delay_us,
                    instances=variant.instances,
                    threads=args.threads,
                    http_port=0,
                    grpc_port=0,
                    metrics_port=0,
                )
            )
            servers[variant] = (server, server_pids(server.grpc_port))
            print(f"server up in {time.perf_counter() - started:.0f} s: {variant.name}", flush=True)
        for (server, pids), case in itertools.product(servers.values(), cases.values()):  # untimed: first calls
            served_segment(protocol, server, pids, case, max(clients), 1.0, args.warmup, args.rtol, args.atol)
        segments: dict[tuple[str, str, int], list[Segment]] = {}
        labels = [("direct", 1), ("direct", args.max_batch)]
        labels += [(variant.name, count) for variant in servers for count in clients]
        for round_index in range(args.rounds):
            for case in cases.values():
                shift = round_index % len(labels)
                for label, count in labels[shift:] + labels[:shift]:
                    with collector_off():
                        if label == "direct":
                            segment = direct_segment(case, args.seconds, args.warmup, count, args.rtol, args.atol)
                        else:
                            server, pids = next(s for v, s in servers.items() if v.name == label)
                            segment = served_segment(
                                protocol, server, pids, case, count, args.seconds, args.warmup, args.rtol, args.atol
                            )
                    segments.setdefault((case.name, label, count), []).append(segment)
            print(f"round {round_index + 1}/{args.rounds} done, {time.time() - began:.0f} s", flush=True)
    rows = []
    for (model, label, count), measured in segments.items():
        row = {"model": model, "mode": label, "clients": 1 if label == "direct" else count}
        row["rows_per_request"] = count if label == "direct" else 1
        row.update(summary(measured))
        rows.append(row)
    variant_info = [asdict(v) | {"name": v.name} for v in variants(args)]
    return {
        "date": time.strftime("%Y-%m-%d %H:%M", time.localtime(began)),
        "command": "python benchmarks/bench_serve.py " + " ".join(sys.argv[1:]),
        "seconds_total": round(time.time() - began, 1),
        "settings": {key: (str(value) if isinstance(value, Path) else value) for key, value in vars(args).items()},
        "models": {name: case.description for name, case in cases.items()},
        "variants": variant_info,
        "load_average": {"before": list(load_before), "after": list(os.getloadavg())},
        "cores": os.cpu_count(),
        "versions": versions(),
        "rows": rows,
        "verdict": verdict(rows, max(clients)),
    }


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for package in ("torch", "onnxruntime", "tritonclient", "nvidia-pytriton", "transformers"):
        with suppress(PackageNotFoundError):
            out[package] = version(package)
    return out


def verdict(rows: list[dict[str, Any]], clients: int) -> list[dict[str, Any]]:
    """Per model and instance count: the best dynamic-batching variant at ``clients`` against no batching."""
    out = []
    for model in sorted({r["model"] for r in rows}):
        at = [r for r in rows if r["model"] == model and r["clients"] == clients and r["mode"] != "direct"]
        for base in [r for r in at if r["mode"].startswith("no batching")]:
            instances = base["mode"].split(", ")[1]
            batched = [r for r in at if r["mode"].startswith("dynamic") and r["mode"].endswith(instances)]
            if not batched:
                continue
            best = max(batched, key=lambda r: r["requests_per_s"])
            paired = [b / a for a, b in zip(base["requests_per_s_rounds"], best["requests_per_s_rounds"], strict=False)]
            ratio = best["requests_per_s"] / base["requests_per_s"]
            clean = all(_clean(r) for r in rows if r["model"] == model)
            out.append(
                {
                    "model": model,
                    "clients": clients,
                    "without": base["mode"],
                    "with": best["mode"],
                    "ratio": ratio,
                    "paired_ratios": [round(p, 2) for p in paired],
                    "goal": GOAL_RATIO,
                    "met": bool(ratio >= GOAL_RATIO and clean),
                    "zero_wrong_lost_errors": clean,
                }
            )
    return out


def _clean(row: dict[str, Any]) -> bool:
    """No wrong answer, error or lost request, and Triton counted exactly the requests the clients sent."""
    counted = row.get("triton", {}).get("counts_match_clients", True)
    return bool(row["wrong"] == 0 and row["errors"] == 0 and row["lost"] == 0 and counted)


def table(results: dict[str, Any]) -> str:
    """The markdown table of every row, then the verdicts."""
    direct = {r["model"]: r for r in results["rows"] if r["mode"] == "direct" and r["rows_per_request"] == 1}
    lines = [
        "| model | served by / called | clients | req/s | samples/s | p50 ms | p99 ms | samples/s vs direct "
        "| rows per execution | queue ms | execution ms | CPU ms/request (clients + server) | wrong | errors | lost |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def key(row: dict[str, Any]) -> tuple[Any, ...]:
        return row["model"], row["mode"] != "direct", row["mode"], row["clients"], row["rows_per_request"]

    for row in sorted(results["rows"], key=key):
        base = direct[row["model"]]["rows_per_s"] if row["model"] in direct else float("nan")
        triton = row.get("triton")
        if triton:
            mode = row["mode"]
            batches = f"{triton['rows_per_execution']:.2f} | {triton['queue_ms_per_request']:.2f}"
            batches += f" | {triton['infer_ms_per_execution']:.2f}"
            cpu = f"{row['client_cpu_ms_per_request']:.2f} + {row['server_cpu_ms_per_request']:.2f}"
        else:
            mode = f"direct, {row['rows_per_request']} row(s) per call"
            batches = f"{row['rows_per_request']} | | {row['p50_ms']:.2f}"
            cpu = f"{row['client_cpu_ms_per_request']:.2f}"
        lines.append(
            f"| {row['model']} | {mode} | {row['clients']} | {row['requests_per_s']:.1f} | {row['rows_per_s']:.1f} "
            f"| {row['p50_ms']:.2f} | {row['p99_ms']:.2f} | {row['rows_per_s'] / base:.2f} | {batches} | {cpu} "
            f"| {row['wrong']} | {row['errors']} | {row['lost']} |"
        )
    lines.append("")
    for item in results["verdict"]:
        lines.append(
            f"- {item['model']} at {item['clients']} clients: {item['with']} / {item['without']} = "
            f"{item['ratio']:.2f}x (per round {', '.join(f'{p:.2f}' for p in item['paired_ratios'])}); goal "
            f">= {item['goal']}x with zero wrong, lost and failed requests: {'MET' if item['met'] else 'NOT MET'}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = arguments(argv)
    results = run(args)
    text = json.dumps(results, indent=2, default=float)
    write_file_atomically(args.json, (text + "\n").encode())
    print(table(results))
    load = results["load_average"]
    print(
        f"\n{results['seconds_total']:.0f} s; protocol {args.protocol}; ONNX Runtime threads {args.threads} "
        f"(served instances and direct); load average before {', '.join(f'{v:.2f}' for v in load['before'])}, "
        f"after {', '.join(f'{v:.2f}' for v in load['after'])} ({results['cores']} cores); results in {args.json}"
    )


if __name__ == "__main__":
    main()
