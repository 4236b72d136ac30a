"""Shared by the quantization tests: the real TensorRT-RTX parser and builder on a quantized graph, and a small CNN
trained on scikit-learn's digits (1,797 8x8 images, shipped with scikit-learn) in a few seconds."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn


def build_with_tensorrt_rtx(model: onnx.ModelProto, sm89: bool = False, capabilities: tuple[str, ...] = ()) -> int:
    """Parse and build ``model`` with TensorRT-RTX on this CPU (ahead of time); the plan's size in bytes.
    ``sm89`` targets compute capability 8.9 only, as FP8 needs (the default targets include 8.0 and 8.6);
    ``capabilities`` targets those (``("12.0",)``, as NVFP4 needs)."""
    trt = pytest.importorskip("tensorrt_rtx")
    logger = trt.Logger(trt.Logger.ERROR)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(model.SerializeToString()):
        errors = [f"{parser.get_error(i).node_name()}: {parser.get_error(i).desc()}" for i in range(parser.num_errors)]
        raise AssertionError(f"TensorRT-RTX's parser rejected the graph: {errors}")
    config = builder.create_builder_config()
    dynamic = [network.get_input(i) for i in range(network.num_inputs) if -1 in tuple(network.get_input(i).shape)]
    if dynamic:  # every dynamic dimension from 1 to 8
        profile = builder.create_optimization_profile()
        for tensor in dynamic:
            shape = tuple(tensor.shape)
            low, high = tuple(1 if d == -1 else d for d in shape), tuple(8 if d == -1 else d for d in shape)
            profile.set_shape(tensor.name, low, high, high)
        config.add_optimization_profile(profile)
    targets = ("8.9",) if sm89 else capabilities
    if targets:
        config.num_compute_capabilities = len(targets)
        for index, target in enumerate(targets):
            config.set_compute_capability(getattr(trt.ComputeCapability, "SM" + target.replace(".", "")), index)
    plan = builder.build_serialized_network(network, config)
    assert plan is not None, "TensorRT-RTX's builder failed (see its log)"
    return int(plan.nbytes)


class DigitsCNN(nn.Module):
    """Two convolutions, pooling and a linear head: 8x8 grey digits -> 10 logits."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)
        )
        self.head = nn.Linear(32 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


def digits() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Train and test splits (80/20, fixed seed), pixels scaled to [0, 1]."""
    datasets = pytest.importorskip("sklearn.datasets")
    data = datasets.load_digits()
    images = torch.tensor(data.images / 16.0, dtype=torch.float32).unsqueeze(1)
    labels = torch.tensor(data.target)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
    images, labels = images[order], labels[order]
    split = int(0.8 * len(labels))
    return images[:split], labels[:split], images[split:], labels[split:]


def trained_digits_cnn(x: torch.Tensor, y: torch.Tensor, epochs: int = 6) -> DigitsCNN:
    """Adam on minibatches of 128: about 97% test accuracy in a few seconds on a CPU."""
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: one thread is fastest on a shared machine
    model = _fit(DigitsCNN(), x, y, epochs, 1e-2, 128)
    torch.set_num_threads(threads)
    return model


def upsampled(images: torch.Tensor, size: int = 32) -> torch.Tensor:
    """Digits (N x 1 x 8 x 8) resized to ``size`` x ``size`` (bilinear): inputs a small ResNet can take."""
    return nn.functional.interpolate(images, size=(size, size), mode="bilinear", align_corners=False)


def trained_digits_resnet(x: torch.Tensor, y: torch.Tensor, epochs: int = 4) -> nn.Module:
    """The bundled SmallResNet (``examples/cnn.py``: a stem, three residual blocks with batch norm, a linear head) with
    one input channel, trained on :func:`upsampled` digits: about 98% test accuracy in a few seconds on a CPU."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    import cnn

    torch.manual_seed(0)
    return _fit(cnn.SmallResNet(10, in_channels=1), x, y, epochs, 3e-3, 64)


def _fit(model: nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int, lr: float, batch: int) -> Any:
    """Adam with cross-entropy on shuffled minibatches; the model in eval mode."""
    optimiser = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(epochs):
        for index in torch.randperm(len(y)).split(batch):
            optimiser.zero_grad()
            nn.functional.cross_entropy(model(x[index]), y[index]).backward()
            optimiser.step()
    return model.eval()


def digits_task(resnet: bool = False) -> tuple[nn.Module, torch.Tensor, torch.Tensor, list[torch.Tensor], float]:
    """A model trained on the digits (:func:`trained_digits_cnn`, or :func:`trained_digits_resnet` on
    :func:`upsampled` images), the test images and labels, eight calibration batches of 64 training images, and the
    model's fp32 top-1 on the test split, checked to mean something (the task is learnt)."""
    x_train, y_train, x_test, y_test = digits()
    if resnet:
        x_train, x_test = upsampled(x_train), upsampled(x_test)
    model = (trained_digits_resnet if resnet else trained_digits_cnn)(x_train, y_train)
    with torch.no_grad():
        fp32 = accuracy(model(x_test), y_test)
    assert fp32 > 0.94  # a point of accuracy means something
    return model, x_test, y_test, [x_train[i : i + 64] for i in range(0, 512, 64)], fp32


def accuracy(logits: torch.Tensor | np.ndarray, labels: torch.Tensor) -> float:
    return float((torch.as_tensor(logits).argmax(dim=1) == labels).float().mean())


def conv_gemm_model(opset: int = 21) -> onnx.ModelProto:
    """x -> Conv -> Relu -> Flatten -> Gemm(transB=1) -> y, and a second Gemm reading the same Flatten output."""
    rng = np.random.default_rng(0)
    w = rng.normal(size=(4, 2, 3, 3)).astype(np.float32) * np.array([1, 0.1, 3, 0.01], np.float32)[:, None, None, None]
    b = rng.normal(size=4).astype(np.float32)
    g = rng.normal(size=(5, 4 * 4 * 4)).astype(np.float32)
    h = rng.normal(size=(4 * 4 * 4, 3)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Flatten", ["r"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "g"], ["y"], name="gemm", transB=1),
        helper.make_node("MatMul", ["f", "h"], ["z"], name="matmul"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2, 4, 4])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5]),
            helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 3]),
        ],
        [numpy_helper.from_array(a, n) for a, n in ((w, "w"), (b, "b"), (g, "g"), (h, "h"))],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
