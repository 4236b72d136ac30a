"""The engine cache on the CPU, with real files and real processes: keys, atomic entries, the lock, corruption.

The cache stores bytes, so the "engines" here are arbitrary bytes; nothing is mocked.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from converters.errors import BuildError
from converters.settings import Settings
from pipeline.backends.tensorrt.engine_cache import EngineCache, cache_key, graph_digest
from pipeline.runtime.io_spec import IOSpec, TensorSpec
from pipeline.runtime.tensorrt.identity import build_options

DEVICE = {"tensorrt": "10.16.1.11", "compute_capability": "8.9"}


def small_graph(weight: float = 1.0) -> onnx.ModelProto:
    w = numpy_helper.from_array(np.full((4, 4), weight, dtype=np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="matmul")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [w],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def io_spec() -> IOSpec:
    return IOSpec(
        inputs=(TensorSpec("x", "float32", ("batch", 4)),),
        outputs=(TensorSpec("y", "float32", ("batch", 4)),),
        input_tree="",
        input_leaves=(),
        output_tree="",
        output_leaves=(),
        signature=(),
    )


# -- keys ----------------------------------------------------------------------------------------------------------


def test_key_is_stable_and_changes_with_graph_device_and_each_build_setting(tmp_path: Path) -> None:
    io = io_spec()
    base = Settings(dynamic={"x": {0: ("batch", 1, 4, 8)}}, cache_dir=str(tmp_path))
    key = cache_key(graph_digest(small_graph()), DEVICE, build_options(io, base))
    assert key == cache_key(graph_digest(small_graph()), dict(DEVICE), build_options(io, base))
    assert len(key) == 64 and int(key, 16) >= 0

    others = {
        "graph": cache_key(graph_digest(small_graph(2.0)), DEVICE, build_options(io, base)),
        "tensorrt": cache_key(
            graph_digest(small_graph()), {**DEVICE, "tensorrt": "11.4.0.106"}, build_options(io, base)
        ),
        "gpu": cache_key(graph_digest(small_graph()), {**DEVICE, "compute_capability": "9.0"}, build_options(io, base)),
    }
    changes = {
        "profile": {"dynamic": {"x": {0: ("batch", 1, 4, 16)}}},
        "workspace": {"trt_workspace_bytes": 1 << 30},
        "shared memory": {"trt_tactic_shared_memory_bytes": 1 << 16},
        "opt level": {"trt_builder_optimization_level": 5},
        "tf32": {"trt_tf32": True},
        "version compatible": {"trt_version_compatible": True},
        "hardware": {"trt_hardware_compatibility": "ampere_plus"},
    }
    for what, change in changes.items():
        settings = Settings(**{"dynamic": base.dynamic, "cache_dir": str(tmp_path), **change})
        others[what] = cache_key(graph_digest(small_graph()), DEVICE, build_options(io, settings))
    assert key not in others.values()
    assert len(set(others.values())) == len(others), others

    unrelated = Settings(dynamic=base.dynamic, cache_dir=str(tmp_path / "elsewhere"), validate=False, seed=7)
    assert cache_key(graph_digest(small_graph()), DEVICE, build_options(io, unrelated)) == key


def test_graph_digest_includes_external_data(tmp_path: Path) -> None:
    model = small_graph()
    onnx.save_model(model, tmp_path / "m.onnx", save_as_external_data=True, location="m.data", size_threshold=0)
    outside = onnx.load_model(tmp_path / "m.onnx", load_external_data=False)
    assert outside.graph.initializer[0].data_location == TensorProto.EXTERNAL
    before = graph_digest(outside, tmp_path)

    data = bytearray((tmp_path / "m.data").read_bytes())
    data[0] ^= 0xFF  # other weights, same graph bytes
    (tmp_path / "m.data").write_bytes(bytes(data))
    assert graph_digest(outside, tmp_path) != before

    with pytest.raises(BuildError, match="external file 'm.data'.*no directory"):
        graph_digest(outside)
    (tmp_path / "m.data").unlink()
    with pytest.raises(BuildError, match="cannot be read"):
        graph_digest(outside, tmp_path)


# -- entries -------------------------------------------------------------------------------------------------------


def test_miss_builds_and_stores_then_hits_without_building(tmp_path: Path) -> None:
    cache = EngineCache(tmp_path / "engines")
    builds: list[str] = []

    def build() -> bytes:
        builds.append("built")
        return b"\x00engine bytes\xff" * 100

    first = cache.get_or_build("k1", build)
    second = cache.get_or_build("k1", build)
    assert (first.status, second.status) == ("built", "hit")
    assert first.engine == second.engine and builds == ["built"]
    assert sorted(p.name for p in (tmp_path / "engines").iterdir()) == ["k1.plan", "k1.plan.lock", "k1.plan.sha256"]
    assert first.path.read_bytes() == first.engine


def test_failed_build_stores_nothing_and_the_next_call_builds(tmp_path: Path) -> None:
    cache = EngineCache(tmp_path)

    def fail() -> bytes:
        raise BuildError("no engine", fix="none")

    with pytest.raises(BuildError):
        cache.get_or_build("k", fail)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.plan.lock"]
    assert cache.get_or_build("k", lambda: b"engine").status == "built"


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (lambda plan: plan.write_bytes(plan.read_bytes()[:-3]), "do not match the recorded SHA-256"),
        (lambda plan: plan.with_name(plan.name + ".sha256").unlink(), "SHA-256 file is missing"),
    ],
    ids=["truncated", "no-digest"],
)
def test_corrupted_entry_is_reported_removed_and_rebuilt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: object, why: str
) -> None:
    cache = EngineCache(tmp_path)
    stored = cache.get_or_build("k", lambda: b"first engine")
    damage(stored.path)  # type: ignore[operator]
    with caplog.at_level(logging.WARNING, logger="pipeline.backends.tensorrt.engine_cache"):
        again = cache.get_or_build("k", lambda: b"second engine")
    assert again.engine == b"second engine"
    assert again.status.startswith("rebuilt") and why in again.status
    assert any("is corrupted" in r.getMessage() and why in r.getMessage() for r in caplog.records)
    assert cache.get_or_build("k", lambda: b"third").status == "hit"


def test_entries_are_written_atomically_and_leave_no_temporary_files(tmp_path: Path) -> None:
    cache = EngineCache(tmp_path)
    cache.get_or_build("k", lambda: os.urandom(1 << 20))
    replaced = cache.get_or_build("k2", lambda: b"x")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # write_file_atomically's temporaries
    assert replaced.path.read_bytes() == b"x"


def test_timing_cache_is_one_file_per_tensorrt_version_and_gpu(tmp_path: Path) -> None:
    cache = EngineCache(tmp_path)
    here = cache.timing_cache_path(DEVICE)
    assert here.parent == tmp_path
    assert here != cache.timing_cache_path({**DEVICE, "compute_capability": "9.0"})
    assert here != cache.timing_cache_path({**DEVICE, "tensorrt": "11.4.0.106"})
    assert here == cache.timing_cache_path(dict(DEVICE))


# -- two processes -------------------------------------------------------------------------------------------------

WORKER = """
import sys, time
from pathlib import Path
from pipeline.backends.tensorrt.engine_cache import EngineCache

directory, who = Path(sys.argv[1]), sys.argv[2]

def wait_for(name):
    while not (directory / name).exists():
        time.sleep(0.01)

def build():
    with (directory / "builds.log").open("a") as log:
        log.write(who + "\\n")
    (directory / f"{who}.building").touch()
    wait_for("release")  # hold the lock until the test says so
    return f"engine built by {who}".encode()

(directory / f"{who}.ready").touch()
wait_for(f"{who}.go")
(directory / f"{who}.waiting").touch()
result = EngineCache(directory / "engines").get_or_build("same-key", build)
print(result.status, result.engine.decode())
"""


def wait_for(path: Path, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"timed out waiting for {path}"
        time.sleep(0.01)


def test_two_processes_build_the_same_engine_once(tmp_path: Path) -> None:
    command = [sys.executable, "-c", WORKER, str(tmp_path)]
    workers = [
        subprocess.Popen([*command, who], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for who in ("first", "second")
    ]
    wait_for(tmp_path / "first.ready")
    wait_for(tmp_path / "second.ready")
    (tmp_path / "first.go").touch()
    wait_for(tmp_path / "first.building")  # the first process holds the entry's lock and is building
    (tmp_path / "second.go").touch()
    wait_for(tmp_path / "second.waiting")  # the second asks for the same key now
    time.sleep(0.3)  # without the lock it would be building by now
    (tmp_path / "release").touch()
    outs = [w.communicate(timeout=120) for w in workers]
    assert [w.returncode for w in workers] == [0, 0], [err for _, err in outs]
    assert (tmp_path / "builds.log").read_text().split() == ["first"]
    assert outs[0][0].strip() == "built engine built by first"
    assert outs[1][0].strip() == "hit engine built by first"


def test_every_setting_marked_engine_is_in_the_key_and_no_other(tmp_path: Path) -> None:
    io = io_spec()
    base = Settings(dynamic={"x": {0: ("batch", 1, 4, 8)}}, cache_dir=str(tmp_path))
    marked = set(base.engine_settings())
    assert {"trt_workspace_bytes", "trt_tf32", "trt_hardware_compatibility", "dynamic"} <= marked
    options = build_options(io, base)
    assert marked <= set(options), "a setting marked engine=True is missing from the engine cache key"
    assert set(options) - marked == {"profile"}
    grouped = base.grouped()
    assert sum(len(v) for v in grouped.values()) == len(dataclasses.fields(Settings))
    assert grouped["tensorrt"]["trt_tf32"] is False and grouped["precision"]["precision"] == "fp32"
