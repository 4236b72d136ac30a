"""The tensorrt.plugin side of ``converters.register_plugin``, against the real TensorRT 10.16 and 11.4 bindings.

The bindings come from the shared trt-api tool (``../shared/tools/trt-api``): the real Python API, with stand-in
libraries whose factories return null, so nothing can build or run. Everything of ``tensorrt.plugin`` that is
Python runs for real: ``trtp.register`` and ``trtp.impl`` check our generated signatures, the plugin creator is
made and advertises its fields, ``create_plugin`` decodes the fields TensorRT's ONNX parser builds from the node's
attributes (INT -> int32, FLOAT -> float32, STRING -> NUL-terminated chars), the real plugin class asks our shape
function for output dtypes, serialises its attributes and is re-created from them as on engine load, and
``enqueue`` calls our impl with real ``trtp.Tensor`` objects. Only two things are stood in: the plugin registry
(null here; a dict that keeps creators) and the device (the impl's CUDA wrapping reads the tensors' real
``__cuda_array_interface__`` as host memory). Shape expressions need a real TensorRT expression builder: not here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SETUP = Path(__file__).resolve().parents[3] / "shared" / "tools" / "trt-api" / "setup.sh"
VERSIONS = ("11.4.0.106", "10.16.1.11")

SCRIPT = r'''
import contextlib, json, numpy as np, onnx, torch
import tensorrt as trt
import tensorrt.plugin as trtp
import tensorrt.plugin._lib as qdp
import converters
from pipeline.runtime import plugins as plugin_runtime


@torch.library.custom_op("trtcheck::topk_keep", mutates_args=())
def topk_keep(x: torch.Tensor, k: int, fill: float, largest: bool, mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    idx = torch.topk(x, k, dim=-1, largest=largest).indices
    keep = torch.zeros_like(x, dtype=torch.bool).scatter(-1, idx, True)
    return torch.where(keep, x if mode == "keep" else torch.ones_like(x), torch.full_like(x, fill)), idx


@topk_keep.register_fake
def _(x, k, fill, largest, mode):
    return torch.empty_like(x), x.new_empty((*x.shape[:-1], k), dtype=torch.int64)


@torch.library.custom_op("trtcheck::pick", mutates_args=())
def pick(x: torch.Tensor, cols: list[int], weights: list[float], negate: list[bool]) -> torch.Tensor:
    return x[..., cols] * torch.tensor([-w if n else w for w, n in zip(weights, negate)], dtype=x.dtype)


@pick.register_fake
def _(x, cols, weights, negate):
    return x.new_empty((*x.shape[:-1], len(cols)))


class Registry:  # the API-only bindings have a null plugin registry: keep the creators here
    def __init__(self):
        self.creators = {}

    def register_creator(self, creator, namespace):
        self.creators[(creator.name, creator.plugin_version, namespace)] = creator
        return True

    def get_creator(self, name, version, namespace):
        return self.creators[(name, version, namespace)]


registry = Registry()
trt.get_plugin_registry = lambda: registry


class HostView:  # a trtp.Tensor's real __cuda_array_interface__, read as host memory (no GPU here)
    def __init__(self, tensor):
        cai = tensor.__cuda_array_interface__
        self.__array_interface__ = {k: cai[k] for k in ("shape", "typestr", "data", "strides")} | {"version": 3}


plugin_runtime.as_torch = lambda t: torch.from_numpy(np.asarray(HostView(t)))
plugin_runtime.on_stream = lambda stream: contextlib.nullcontext()
TRT_TYPES = {np.dtype(np.float32): trt.DataType.FLOAT, np.dtype(np.int64): trt.DataType.INT64}


def parser_fields(attrs):
    """PluginFields as TensorRT's ONNX parser builds them from node attributes (the arrays must stay alive)."""
    arrays, fields = [], []
    for name, value in attrs.items():
        if isinstance(value, str):
            array, kind = np.frombuffer(value.encode() + b"\x00", np.int8), trt.PluginFieldType.CHAR
        elif isinstance(value, float):
            array, kind = np.array([value], np.float32), trt.PluginFieldType.FLOAT32
        else:
            array, kind = np.array([value], np.int32), trt.PluginFieldType.INT32
        arrays.append(array)
        fields.append(trt.PluginField(name, array, kind))
    return arrays, trt.PluginFieldCollection(fields)


def desc(array):
    d = trt.PluginTensorDesc()
    d.dims, d.type, d.format, d.scale = trt.Dims(array.shape), TRT_TYPES[array.dtype], trt.TensorFormat.LINEAR, 1.0
    return d


def enqueue(plugin, x, outs):
    strides = lambda a: trt.Dims([s // a.itemsize for s in a.strides])
    plugin.enqueue([desc(x)], [desc(o) for o in outs], [x.ctypes.data], [o.ctypes.data for o in outs],
                   [strides(x)], [strides(o) for o in outs], 0)
    return outs


def plugin_model(name, attrs):
    node = onnx.helper.make_node(name, ["x"], ["y"], domain="ai.onnx.contrib", **attrs)
    graph = onnx.helper.make_graph([node], "g", [], [])
    return onnx.helper.make_model(graph)


report = {}
specs = converters.ConverterRegistry()
converters.register_plugin("trtcheck::topk_keep", registry=specs)
converters.register_plugin("trtcheck::pick", registry=specs)
# the nodes register_plugin's converter writes: they name the torch op they run
model = plugin_model("topk_keep", {"plugin_namespace": "trtcheck", "k": 3,
                                   "plugin_torch_op": "trtcheck::topk_keep.default"})
report["registered"] = plugin_runtime.register_tensorrt_plugins(model)
report["again"] = plugin_runtime.register_tensorrt_plugins(model)  # a second build in the same process
definition = qdp.QDP_REGISTRY["trtcheck::topk_keep"]
report["outputs"] = definition.num_outputs
report["impl_attrs"] = definition.impl_attr_names
report["op"] = hasattr(trtp.op.trtcheck, "topk_keep")
creator = registry.get_creator("topk_keep", "1", "trtcheck")
report["creator"] = [creator.name, creator.plugin_namespace, creator.plugin_version]
report["fields"] = [[f.name, f.type.name] for f in creator.field_names]

x = np.random.default_rng(0).standard_normal((4, 10)).astype(np.float32)
keep, fields = parser_fields({"k": 3, "fill": -1.5, "largest": 1, "mode": "keep"})
plugin = creator.create_plugin("topk_keep", "trtcheck", fields, trt.TensorRTPhase.BUILD)
report["dtypes"] = [t.name for t in plugin.get_output_data_types([trt.DataType.FLOAT], [2])]
expected = [t.numpy() for t in topk_keep(torch.from_numpy(x), 3, -1.5, True, "keep")]
got = enqueue(plugin, x, [np.zeros((4, 10), np.float32), np.zeros((4, 3), np.int64)])
report["enqueue"] = all(np.array_equal(g, e) for g, e in zip(got, expected))
loaded = creator.create_plugin("topk_keep", "trtcheck", plugin.get_fields_to_serialize(), trt.TensorRTPhase.RUNTIME)
got = enqueue(loaded, x, [np.zeros((4, 10), np.float32), np.zeros((4, 3), np.int64)])
report["deserialised"] = all(np.array_equal(g, e) for g, e in zip(got, expected))

plugin_runtime.register_tensorrt_plugins(
    plugin_model("pick", {"plugin_namespace": "trtcheck", "plugin_torch_op": "trtcheck::pick.default"})
)
lists = {"cols": "[4, 0, 2]", "weights": "[0.5, 2.0, -1.25]", "negate": "[false, true, true]"}
keep, fields = parser_fields(lists)
plugin = registry.get_creator("pick", "1", "trtcheck").create_plugin("pick", "trtcheck", fields,
                                                                      trt.TensorRTPhase.BUILD)
report["pick_dtypes"] = [t.name for t in plugin.get_output_data_types([trt.DataType.FLOAT], [2])]
(got,) = enqueue(plugin, x, [np.zeros((4, 3), np.float32)])
report["pick"] = bool(np.array_equal(got, pick(torch.from_numpy(x), [4, 0, 2], [0.5, 2.0, -1.25],
                                                [False, True, True]).numpy()))
print(json.dumps(report))
'''


def prepare(version: str) -> None:
    if not SETUP.is_file():
        pytest.skip(f"the shared TensorRT API tool is not at {SETUP}")
    prepared = subprocess.run(
        ["bash", str(SETUP), version],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHON": sys.executable},
    )
    if prepared.returncode != 0:
        pytest.skip(f"trt-api {version} could not be set up: {prepared.stderr[-300:]}")


@pytest.mark.parametrize("version", VERSIONS)
def test_register_plugin_against_the_real_tensorrt_plugin_api(version: str) -> None:
    prepare(version)
    command = [
        "bash",
        "-c",
        f'eval "$(bash {SETUP} --env {version})" && exec "$@"',
        "trt-api",
        sys.executable,
        "-c",
        SCRIPT,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["registered"] == ["trtcheck::topk_keep"] and report["again"] == ["trtcheck::topk_keep"]
    assert report["outputs"] == 2 and report["op"]
    assert report["impl_attrs"] == ["k", "fill", "largest", "mode"]  # all serialised into the engine
    assert report["creator"] == ["topk_keep", "trtcheck", "1"]
    assert report["fields"] == [["k", "INT32"], ["fill", "FLOAT32"], ["largest", "INT32"], ["mode", "CHAR"]]
    assert report["dtypes"] == ["FLOAT", "INT64"] and report["pick_dtypes"] == ["FLOAT"]
    assert report["enqueue"] and report["deserialised"] and report["pick"]
