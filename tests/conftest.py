"""Shared test helpers. Tests use real models, real exports, real ONNX Runtime sessions and real Polygraphy."""

from __future__ import annotations

import os

import pytest
import tests_environment  # noqa: F401 -- torchvision's operator schemas, before anything imports torchvision
import torch


def pytest_configure(config: pytest.Config) -> None:
    """Polygraphy binds one TensorRT library per process, on the first import of ``polygraphy.backend.trt``
    (``pipeline.runtime.tensorrt.library``). The tests build with TensorRT-RTX, the library that installs here: bind
    it before any test runs, so that a test importing Polygraphy's TensorRT loaders without building (a profile test)
    cannot bind the other library for the rest of its worker process, whatever order the files run in."""
    from pipeline.runtime.tensorrt.library import TENSORRT_RTX, bind_polygraphy

    if TENSORRT_RTX.importable():
        bind_polygraphy(TENSORRT_RTX)


@pytest.fixture(autouse=True)
def _seeded() -> None:
    torch.manual_seed(0)


#: The longest files of the suite (worker seconds in a clean-clone CI run, 2026-11-30: 23 files, 2,024 of the 3,477
#: worker seconds; and three files of 50-80 s added after it), started first. The README's command deals whole files
#: to the workers in collection order (``--dist loadfile``); collected alphabetically, the longest (the docs'
#: examples, 400 s) came near the end and ran alone for minutes while the other worker idled.
LONGEST_FIRST = (
    "tests/test_docs.py",
    "tests/pipeline/generation/test_encoder_decoder.py",
    "tests/converters/aten/test_builtin_cases.py",
    "tests/converters/aten/test_pointwise.py",
    "tests/converters/aten/test_tensor.py",
    "tests/pipeline/generation/test_cross_images.py",
    "tests/pipeline/generation/test_vision_language.py",
    "tests/pipeline/test_external_data.py",
    "tests/pipeline/generation/test_latent_attention.py",
    "tests/pipeline/test_opinfo.py",
    "tests/pipeline/serving/test_serve_images.py",
    "tests/pipeline/generation/test_blip_git.py",
    "tests/pipeline/generation/test_cli_cross_images.py",
    "tests/pipeline/exporting/test_moe_dispatch.py",
    "tests/pipeline/generation/test_vision_language_grid.py",
    "tests/pipeline/test_cli_hostile.py",
    "tests/test_readme.py",
    "tests/pipeline/test_cli_inspect_bench.py",
    "tests/pipeline/generation/test_vision_language_families.py",
    "tests/test_imports.py",
    "tests/pipeline/serving/test_serve_two_graphs.py",
    "tests/passes/test_pass_properties.py",
    "tests/pipeline/test_rtx_builds.py",
    "tests/pipeline/test_quantize_charlm.py",
    "tests/pipeline/serving/test_serve.py",
    "tests/pipeline/test_model_suite.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The files of :data:`LONGEST_FIRST` first, in that order; every other file after them, as collected."""
    rank = {path: index for index, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


def _one_thread_per_worker() -> None:
    """Under the README's command each of the ``-n auto`` workers has a core of its own: PyTorch and every ONNX
    Runtime session the tests make take one intra-op thread instead of one per core. Two workers each running two
    threads (ONNX Runtime's spinning in them) on 2 cores made the suite about 20% slower in wall time and 30% in CPU.
    A session whose options name a thread count keeps it, so a test of the threads setting sees its own."""
    import onnxruntime

    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # PyTorch in the processes the tests start (a page, the CLI)
    session_init = onnxruntime.InferenceSession.__init__

    def one_thread_init(self, path_or_bytes, sess_options=None, *args, **kwargs):  # type: ignore[no-untyped-def]
        options = sess_options if sess_options is not None else onnxruntime.SessionOptions()
        if options.intra_op_num_threads == 0:
            options.intra_op_num_threads = 1
        session_init(self, path_or_bytes, options, *args, **kwargs)

    onnxruntime.InferenceSession.__init__ = one_thread_init


if os.environ.get("PYTEST_XDIST_WORKER"):
    _one_thread_per_worker()
