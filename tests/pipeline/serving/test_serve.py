"""`pipeline.serve`: artifacts served by a real Triton Inference Server, asked over HTTP and gRPC by tritonclient.

One server (started once for the module) serves three artifacts: a small CNN converted with a dynamic batch (the
dynamic batcher joins requests), an MLP with fixed shapes (each request alone) and a tiny Llama generation artifact
(decoupled: one response per token). Every answer is compared with the same artifact called directly.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tiny_models import tiny_llama

import pipeline

http = pytest.importorskip("tritonclient.http", reason="the serve extra (tritonclient) is not installed")
grpc = pytest.importorskip("tritonclient.grpc", reason="the serve extra (tritonclient) is not installed")
from triton_streams import stream  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402


class SmallCNN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.head = torch.nn.Linear(8, 5)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.conv(image)).mean(dim=(2, 3)))


PROMPT = torch.tensor([[5, 17, 42, 8, 63, 21, 9, 30]])


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("served")
    torch.manual_seed(0)
    cnn = pipeline.convert(SmallCNN().eval(), torch.randn(2, 3, 16, 16), dynamic={"image": {0: ("batch", 1, 8, 16)}})
    mlp = pipeline.convert(torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.Tanh()).eval(), torch.randn(2, 6))
    llama = pipeline.convert(tiny_llama(), PROMPT, generation={"max_length": 40, "max_batch": 2}, validate=False)
    paths = {"cnn": root / "cnn.ptrt", "mlp": root / "mlp.ptrt", "llama": root / "llama.ptrt"}
    for name, module in (("cnn", cnn), ("mlp", mlp), ("llama", llama)):
        module.save(paths[name])
    return paths


@pytest.fixture(scope="module")
def server(artifacts: dict[str, Path]) -> Iterator[pipeline.TritonServer]:
    with pipeline.serve(
        artifacts, max_queue_delay_us=2000, threads=1, spinning=False, http_port=0, grpc_port=0, metrics_port=0
    ) as running:
        yield running


@pytest.fixture(scope="module")
def direct(artifacts: dict[str, Path]) -> dict[str, Any]:
    return {name: pipeline.load(path) for name, path in artifacts.items()}


def _ask_http(client: Any, model: str, name: str, array: np.ndarray, output: str) -> np.ndarray:
    given = http.InferInput(name, list(array.shape), "FP32")
    given.set_data_from_numpy(array)
    result: np.ndarray = client.infer(model, [given]).as_numpy(output)
    return result


def _ask_grpc(client: Any, model: str, name: str, array: np.ndarray, output: str) -> np.ndarray:
    given = grpc.InferInput(name, list(array.shape), "FP32")
    given.set_data_from_numpy(array)
    result: np.ndarray = client.infer(model, [given]).as_numpy(output)
    return result


def test_answers_equal_direct_calls_over_http_and_grpc(server: Any, direct: dict[str, Any]) -> None:
    images = np.random.default_rng(1).standard_normal((3, 3, 16, 16), dtype=np.float32)
    expected = direct["cnn"](torch.from_numpy(images)).numpy()
    out = direct["cnn"].io.outputs[0].name
    np.testing.assert_array_equal(
        _ask_http(http.InferenceServerClient(server.http_url), "cnn", "image", images, out), expected
    )
    np.testing.assert_array_equal(
        _ask_grpc(grpc.InferenceServerClient(server.grpc_url), "cnn", "image", images, out), expected
    )
    rows = np.random.default_rng(2).standard_normal((2, 6), dtype=np.float32)
    mlp_in, mlp_out = direct["mlp"].io.inputs[0].name, direct["mlp"].io.outputs[0].name
    np.testing.assert_array_equal(
        _ask_http(http.InferenceServerClient(server.http_url), "mlp", mlp_in, rows, mlp_out),
        direct["mlp"](torch.from_numpy(rows)).numpy(),
    )


def test_configs_follow_the_graphs(server: Any) -> None:
    client = http.InferenceServerClient(server.http_url)
    cnn = client.get_model_config("cnn")
    assert cnn["max_batch_size"] == 8 and cnn["input"][0]["dims"] == [3, 16, 16]
    assert cnn["dynamic_batching"]["max_queue_delay_microseconds"] == 2000
    runtime = {key: cnn["parameters"][key]["string_value"] for key in ("threads", "spinning")}
    assert runtime == {"threads": "1", "spinning": "False"}  # what each instance's pipeline.load is given
    mlp = client.get_model_config("mlp")  # fixed shapes: whole tensors, no batcher
    assert mlp["max_batch_size"] == 0 and mlp["input"][0]["dims"] == [2, 6] and "dynamic_batching" not in mlp
    assert client.get_model_config("llama")["model_transaction_policy"]["decoupled"] is True
    assert client.is_server_live() and client.is_server_ready()
    assert all(client.is_model_ready(name) for name in ("cnn", "mlp", "llama"))


def test_sixteen_clients_get_their_own_answers_batched_together(server: Any, direct: dict[str, Any]) -> None:
    """16 threads x 100 requests over HTTP and gRPC, batches of 1-3 images: every answer is the direct call's."""
    out = direct["cnn"].io.outputs[0].name
    before = _counts(server)
    failures: list[str] = []

    def client(index: int) -> None:
        rng = np.random.default_rng(100 + index)
        ask, connect = (_ask_grpc, grpc) if index % 2 else (_ask_http, http)
        connection = connect.InferenceServerClient(server.grpc_url if index % 2 else server.http_url)
        for request in range(100):
            images = rng.standard_normal((1 + request % 3, 3, 16, 16), dtype=np.float32)
            try:
                got = ask(connection, "cnn", "image", images, out)
            except Exception as err:  # noqa: BLE001 - every failure is collected and reported below
                failures.append(f"client {index} request {request}: {err}")
                continue
            expected = direct["cnn"](torch.from_numpy(images)).numpy()
            if got.shape != expected.shape or not np.allclose(got, expected, rtol=1e-5, atol=1e-6):
                failures.append(f"client {index} request {request}: wrong answer")

    threads = [threading.Thread(target=client, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    requests, executions = (after - first for after, first in zip(_counts(server), before, strict=True))
    assert requests == 1600
    assert executions < requests * 0.8, f"{executions} executions for {requests} requests: nothing was batched"


def _counts(server: Any) -> tuple[int, int]:
    stats = http.InferenceServerClient(server.http_url).get_inference_statistics("cnn")["model_stats"][0]
    return int(stats["inference_stats"]["success"]["count"]), int(stats["execution_count"])


@pytest.mark.parametrize(
    ("name", "shape", "dtype", "says"),
    [
        ("pixels", (1, 3, 16, 16), "FP32", "pixels"),
        ("image", (1, 3, 16, 16), "FP16", "FP16"),
        ("image", (1, 3, 8, 16), "FP32", "[1,3,8,16]"),
        ("image", (9, 3, 16, 16), "FP32", "batch-size"),
    ],
)
def test_bad_requests_get_errors_naming_the_cause_and_the_server_keeps_serving(
    server: Any, name: str, shape: tuple[int, ...], dtype: str, says: str
) -> None:
    client = http.InferenceServerClient(server.http_url)
    given = http.InferInput(name, list(shape), dtype)
    given.set_data_from_numpy(np.zeros(shape, dtype=np.float16 if dtype == "FP16" else np.float32))
    with pytest.raises(InferenceServerException, match=r"(?i)" + re.escape(says)):
        client.infer("cnn", [given])
    images = np.ones((1, 3, 16, 16), dtype=np.float32)
    assert _ask_http(client, "cnn", "image", images, "out").shape == (1, 5)


def _stream(server: Any, ids: torch.Tensor, on_first: Any = None, **options: Any) -> tuple[np.ndarray, list[str]]:
    """One decoupled generation request to the served Llama over gRPC: the tokens of every response, and the errors
    (``on_first`` is called once the first token is in)."""
    return stream(server.grpc_url, "llama", {"input_ids": ids}, on_first=on_first, **options)


def test_generation_streams_the_tokens_of_generate(server: Any, direct: dict[str, Any]) -> None:
    expected = direct["llama"].generate(PROMPT, max_new_tokens=12)[:, PROMPT.shape[1] :].numpy()
    tokens, errors = _stream(server, PROMPT, max_new_tokens=12)
    assert errors == [] and tokens.tolist() == expected.tolist()
    banned = direct["llama"].generate(PROMPT, max_new_tokens=12, min_new_tokens=10, no_repeat_ngram_size=2)
    tokens, errors = _stream(server, PROMPT, max_new_tokens=12, min_new_tokens=10, no_repeat_ngram_size=2)
    assert errors == [] and tokens.tolist() == banned[:, PROMPT.shape[1] :].tolist()
    sampled = direct["llama"].generate(PROMPT, max_new_tokens=8, do_sample=True, top_k=5, seed=7)
    tokens, errors = _stream(server, PROMPT, max_new_tokens=8, do_sample=True, top_k=5, seed=7)
    assert errors == [] and tokens.tolist() == sampled[:, PROMPT.shape[1] :].tolist()


def test_concurrent_streams_each_get_their_own_tokens(server: Any, direct: dict[str, Any]) -> None:
    prompts = [torch.randint(1, 90, (1, 6), generator=torch.Generator().manual_seed(i)) for i in range(6)]
    expected = [direct["llama"].generate(p, max_new_tokens=10)[:, 6:].tolist() for p in prompts]
    got: dict[int, Any] = {}

    def one(index: int) -> None:
        got[index] = _stream(server, prompts[index], max_new_tokens=10)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [got[i][1] for i in range(len(prompts))] == [[]] * len(prompts)
    assert [got[i][0].tolist() for i in range(len(prompts))] == expected


@pytest.mark.parametrize(
    ("ids", "options", "says"),
    [
        (torch.randint(1, 90, (1, 45)), {"max_new_tokens": 4}, "max_length"),
        (PROMPT, {"num_beams": 2}, "num_beams"),
        (PROMPT, {"max_new_tokens": "many"}, "max_new_tokens"),
    ],
)
def test_bad_generation_requests_fail_alone(server: Any, ids: torch.Tensor, options: dict[str, Any], says: str) -> None:
    tokens, errors = _stream(server, ids, **options)
    assert tokens.shape[1] == 0 and len(errors) == 1 and says in errors[0]
    tokens, errors = _stream(server, PROMPT, max_new_tokens=3)
    assert errors == [] and tokens.shape == (1, 3)


def test_metrics_count_the_requests(server: Any) -> None:
    import urllib.request

    with urllib.request.urlopen(server.metrics_url, timeout=10) as reply:
        page = reply.read().decode()
    assert 'nv_inference_request_success{model="cnn",version="1"}' in page


def test_bad_serve_arguments_are_refused_before_the_server_starts(artifacts: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(pipeline.InputError, match="no batch dimension"):
        pipeline.serve({"mlp": artifacts["mlp"]}, max_batch=4, start=False)
    with pytest.raises(pipeline.InputError, match="larger than the batch"):
        pipeline.serve({"cnn": artifacts["cnn"]}, max_batch=32, start=False)
    with pytest.raises(pipeline.InputError, match="no artifact"):
        pipeline.serve(tmp_path / "missing.ptrt", start=False)
    with pytest.raises(pipeline.InputError, match="two artifacts"):
        pipeline.serve([artifacts["cnn"], artifacts["cnn"]], start=False)
    with pytest.raises(pipeline.InputError, match="not a Triton model name"):
        pipeline.serve({"a b": artifacts["cnn"]}, start=False)


def test_cli_serves_until_sigterm_and_finishes_the_stream_in_flight(artifacts: dict[str, Path]) -> None:
    """`pipeline serve` in the foreground: ready, streaming; SIGTERM lets the running stream end, then exits 0."""
    import signal
    import subprocess
    import sys

    from pipeline.serving.server import free_ports

    ports = free_ports(3)
    command = [sys.executable, "-m", "pipeline", "serve", str(artifacts["llama"]), "--name", "llama"]
    command += ["--http-port", str(ports[0]), "--grpc-port", str(ports[1]), "--metrics-port", str(ports[2])]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("serving llama:"), line + process.stderr.read() if process.stderr else line
        server = type("Endpoint", (), {"grpc_url": f"localhost:{ports[1]}"})()
        # eos_token_id outside the vocabulary: the stream runs its 30 steps; SIGTERM comes after the first
        tokens, errors = _stream(
            server, PROMPT, on_first=lambda: process.send_signal(signal.SIGTERM), max_new_tokens=30, eos_token_id=-1
        )
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
    assert errors == [] and tokens.shape == (1, 30)


def test_a_model_that_fails_to_load_stops_the_start_with_its_reason(artifacts: dict[str, Path], tmp_path: Path) -> None:
    doomed = tmp_path / "doomed.ptrt"
    doomed.write_bytes(artifacts["mlp"].read_bytes())
    server = pipeline.serve(doomed, http_port=0, grpc_port=0, metrics_port=0, start=False)
    doomed.unlink()  # gone after the repository was written: the backend's pipeline.load fails
    with pytest.raises(pipeline.ServingError, match=r"model 'doomed' failed to load: ArtifactError.*no artifact"):
        server.start()
    assert not server.running


def test_models_are_named_after_their_file_or_the_convert_directory(artifacts: dict[str, Path], tmp_path: Path) -> None:
    from pipeline.serving.repository import served_artifact

    (tmp_path / "cnn").mkdir()
    (tmp_path / "cnn" / "model.ptrt").write_bytes(artifacts["cnn"].read_bytes())  # `pipeline convert -o cnn` writes
    assert served_artifact(tmp_path / "cnn" / "model.ptrt").name == "cnn"
    assert served_artifact(artifacts["mlp"]).name == "mlp"
    assert served_artifact(artifacts["mlp"], "other").name == "other"


def test_ports_taken_for_zero_are_distinct(tmp_path: Path) -> None:
    """Free ports are chosen together: two chosen one at a time once coincided (gRPC and metrics on one port), and
    tritonserver refused to start."""
    from pipeline.serving.server import TritonServer, free_ports

    assert len(set(free_ports(64))) == 64
    for _ in range(20):
        server = TritonServer(tmp_path, http_port=0, grpc_port=0, metrics_port=8002)
        assert len({server.http_port, server.grpc_port, server.metrics_port}) == 3 and server.metrics_port == 8002
