"""PyTorch's OpInfo samples through the pipeline: pick usable samples, wrap one op in a module, classify the outcome.

Used by ``tests/pipeline/test_opinfo.py`` and by ``benchmarks/opinfo_coverage.py`` (which puts ``tests/`` on
``sys.path``). ``torch.testing._internal.common_methods_invocations.op_db`` (about 700 entries, one per op variant;
importing it needs ``expecttest`` and takes some seconds) describes each op with sample inputs. For one entry:

- :func:`usable_samples` gives its float32 samples that can become a graph: at least one tensor argument, no
  complex, sparse or quantized tensor and no zero-element tensor among the arguments, and eager PyTorch runs it and
  returns a tensor or (nested) tuples/lists of real tensors; when there is none, the reason why;
- :class:`Wrap` makes a module whose ``forward`` takes the sample's tensors (every other argument is baked in);
- :func:`run_ours` classifies ``pipeline.convert`` (ONNX Runtime, validated against PyTorch) followed by the real
  TensorRT-RTX build of ``module.onnx``; :func:`run_plain` classifies plain ``torch.onnx.export(dynamo=True)``
  followed by the same build (the comparison baseline: it checks nothing against PyTorch).

float16 is judged the way a user gets it: the float32 model and sample with ``precision="fp16"`` (the precision
stage rewrites the graph, validation uses the float16 tolerances). OpInfo's own float16 samples would need eager
float16 kernels on the CPU, which many ops lack, and would test the float16 *model* export, not the precision stage.

Classes (:data:`STATUSES`): ``ok`` (converts, matches PyTorch, builds); ``no usable sample``; one per failing stage
of OUR error hierarchy (``input``, ``export``, ``convert``, ``accuracy``, ``build`` from
``converters.errors``), ``parser``/``build`` when TensorRT-RTX rejects the final graph, ``timeout``; and
``crash``: any other exception, a bug in the product.
"""

from __future__ import annotations

import contextlib
import functools
import re
import signal
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import onnx
import torch
from torch.utils import _pytree as pytree

import pipeline
from converters.errors import (
    AccuracyError,
    BuildError,
    ConversionError,
    ExportError,
    InputError,
    PipelineError,
)
from pipeline.precision.buildable import build_error

STATUSES = ("ok", "no usable sample", "input", "export", "convert", "accuracy", "parser", "build", "timeout", "crash")
PRECISIONS = {"float32": "fp32", "float16": "fp16"}
MAX_SAMPLES_SCANNED = 64  # some ops have hundreds of samples; the usable ones come early
REASON_CHARS = 400

_OUR_CLASSES: tuple[tuple[type[PipelineError], str], ...] = (
    (InputError, "input"),
    (ExportError, "export"),
    (ConversionError, "convert"),
    (AccuracyError, "accuracy"),
    (BuildError, "build"),
)


class CaseTimeout(BaseException):  # noqa: N818 -- BaseException: no `except Exception` in the product swallows it
    """Raised by :func:`time_limit` when a case runs past its limit."""


@dataclass(frozen=True)
class Outcome:
    """The class of one run (one of :data:`STATUSES`), the reason (our error's message, or the builder's), and
    whether that reason names the op (see :func:`names_op`)."""

    status: str
    reason: str = ""
    names_op: bool = True

    @property
    def ok(self) -> bool:
        """True for "converts, matches and builds"."""
        return self.status == "ok"


def op_id(op: Any) -> str:
    """The OpInfo entry's id: its name, plus ``.variant`` when it has one (``div.floor_rounding``)."""
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


@functools.cache
def all_ops() -> dict[str, Any]:
    """Every OpInfo entry by :func:`op_id`, in ``op_db`` order (the import takes seconds: done once).

    OpInfo's ``sample_inputs`` looks for the running unittest ``TestCase`` on the call stack (``extract_test_fn``, for
    its per-test seeds and sample skips) with ``inspect.stack()``, which reads source lines and scans every loaded
    module per frame: 0.13 s a call in a test process, 20 s for the 55 ops of one test file. Our tests are not
    unittest cases, where it finds none and returns None: it returns None at once here, so the samples and their seeds
    are those OpInfo gives anyway."""
    warnings.filterwarnings("ignore")
    from torch.testing._internal import common_utils
    from torch.testing._internal.common_methods_invocations import op_db
    from torch.testing._internal.opinfo import core

    common_utils.extract_test_fn = core.extract_test_fn = _no_test_case  # type: ignore[attr-defined]
    return {op_id(op): op for op in op_db}


def _no_test_case() -> None:
    return None


def one_line(text: str, limit: int = REASON_CHARS) -> str:
    """``text`` on one line (whitespace runs collapsed, terminal colour codes dropped), cut to ``limit``."""
    text = " ".join(re.sub(r"\x1b\[[0-9;]*m", "", str(text)).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Wrap(torch.nn.Module):
    """A module whose ``forward`` takes the sample's tensors, in order, and calls the op on them; every other
    argument (numbers, shapes, dtypes, flags) is baked in. ``wrap.tensors`` is the matching call."""

    def __init__(self, op: Any, sample: Any) -> None:
        super().__init__()
        self.op = op.op
        leaves, self.spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
        self.is_tensor = [isinstance(x, torch.Tensor) for x in leaves]
        self.consts = [None if t else x for x, t in zip(leaves, self.is_tensor, strict=True)]
        self.tensors = tuple(x for x, t in zip(leaves, self.is_tensor, strict=True) if t)

    def forward(self, *tensors: torch.Tensor) -> Any:
        """The op on these tensors (in the sample's order) and the baked-in arguments."""
        it = iter(tensors)
        leaves = [next(it) if t else c for t, c in zip(self.is_tensor, self.consts, strict=True)]
        inp, args, kwargs = pytree.tree_unflatten(leaves, self.spec)
        return self.op(inp, *args, **kwargs)


def _argument_problem(sample: Any) -> str | None:
    leaves = pytree.tree_leaves((sample.input, sample.args, sample.kwargs))
    tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
    if not tensors:
        return "no sample has a tensor argument"
    for t in tensors:
        if t.layout != torch.strided or t.is_quantized:
            return "its samples take sparse, nested or quantized tensors"
        if t.is_complex():
            return "its samples take complex tensors"
        if t.numel() == 0:
            return "its samples hold zero-element tensors"
    return None


def _result_problem(result: Any) -> str | None:
    leaves, _ = pytree.tree_flatten(result)
    if isinstance(result, torch.Tensor):
        leaves = [result]
    elif not isinstance(result, (tuple, list)) or not leaves:
        return f"eager PyTorch returns a {type(result).__name__}, not tensors"
    for leaf in leaves:
        if not isinstance(leaf, torch.Tensor):
            return f"eager PyTorch returns a {type(leaf).__name__} among its outputs, not only tensors"
        if leaf.is_complex():
            return "eager PyTorch returns a complex tensor"
        if leaf.layout != torch.strided:
            return "eager PyTorch returns a sparse or nested tensor"
    floats = [leaf for leaf in leaves if leaf.is_floating_point() and leaf.numel()]
    if floats and all(bool(leaf.isnan().all()) for leaf in floats):
        # the validation refuses to call that a match (nothing was compared), and so would a user
        return "eager PyTorch returns NaN at every element: nothing to compare"
    return None


def _eager_problem(op: Any, sample: Any) -> str | None:
    clone = pytree.tree_map_only(torch.Tensor, lambda t: t.clone(), (sample.input, sample.args, sample.kwargs))
    try:
        with torch.no_grad():
            result = op.op(clone[0], *clone[1], **clone[2])
    except Exception as exc:  # eager PyTorch itself rejects the sample: not a usable sample
        return f"eager PyTorch fails on its samples: {type(exc).__name__}: {one_line(str(exc), 120)}"
    return _result_problem(result)


def usable_samples(op: Any, limit: int = 1) -> tuple[list[Any], str]:
    """Up to ``limit`` usable float32 samples of ``op`` (seeded, so the same every run), and when there is none
    the reason (the most frequent one among its samples)."""
    if torch.float32 not in op.supported_dtypes("cpu"):
        return [], "OpInfo lists no float32 support on the CPU"
    torch.manual_seed(0)
    found: list[Any] = []
    problems: dict[str, int] = {}
    try:
        for index, sample in enumerate(op.sample_inputs("cpu", torch.float32, requires_grad=False)):
            if index >= MAX_SAMPLES_SCANNED or len(found) >= limit:
                break
            problem = _argument_problem(sample) or _eager_problem(op, sample)
            if problem is None:
                found.append(sample)
            else:
                problems[problem] = problems.get(problem, 0) + 1
    except Exception as exc:  # OpInfo's own sample generator fails: nothing to convert
        problems[f"OpInfo's sample_inputs fails: {type(exc).__name__}: {one_line(str(exc), 120)}"] = 1
    if found:
        return found, ""
    if not problems:
        return [], "OpInfo gives no float32 sample"
    return [], max(problems, key=lambda p: problems[p])


@contextlib.contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Raise :class:`CaseTimeout` after ``seconds`` (SIGALRM: the main thread only; elsewhere no limit)."""
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def _expired(*_: Any) -> None:
        raise CaseTimeout(f"timeout: still running after {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, _expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def op_names(op: Any) -> set[str]:
    """Names a message may use for ``op``: its OpInfo name and last dotted part, ATen name, function name, aliases."""
    names = {op.name, op.name.split(".")[-1], str(getattr(op, "aten_name", "") or "")}
    names.add(getattr(op.op, "__name__", ""))
    names.update(alias.name.split(".")[-1] for alias in getattr(op, "aliases", ()) or ())
    return {n.lower().strip("_") for n in names if n and n != "<lambda>" and len(n.strip("_")) > 1}


_NODE_REFERENCE = re.compile(r"\b(aten|prims)[.:]+\w+|node '[^']+'|\(at [^)]+\)|\bop [`'\"]\w+", re.IGNORECASE)


def names_op(message: str, op: Any) -> bool:
    """Does an error message name the op: one of :func:`op_names`, an ATen/prims op, or a graph node/op it
    came from (``node 'x' (Softmax)``, ``(at aten.nonzero)``)? A one-op model's node *is* the op."""
    lowered = message.lower()
    if any(re.search(rf"(?<![a-z0-9]){re.escape(name)}(?![a-z0-9])", lowered) for name in op_names(op)):
        return True
    return _NODE_REFERENCE.search(message) is not None


def classify_error(exc: BaseException, op: Any) -> Outcome:
    """The outcome for an exception: our hierarchy by stage, :class:`CaseTimeout`, anything else a crash."""
    if isinstance(exc, CaseTimeout):
        return Outcome("timeout", str(exc))
    text = f"{type(exc).__name__}: {exc}"
    for cls, status in _OUR_CLASSES:
        if isinstance(exc, cls):
            return Outcome(status, one_line(text), names_op(str(exc), op))
    if isinstance(exc, PipelineError):
        return Outcome(exc.stage, one_line(text), names_op(str(exc), op))
    return Outcome("crash", one_line(text), False)


def _rtx_outcome(model: onnx.ModelProto, dynamic: Any, op: Any) -> Outcome:
    error = build_error(model, dynamic)
    if error is None:
        return Outcome("ok")
    status = "parser" if error.startswith("parse:") else "build"
    return Outcome(status, one_line("TensorRT-RTX " + error), names_op(error, op))


def run_ours(op: Any, sample: Any, dtype: str = "float32", timeout: float | None = None) -> Outcome:
    """``pipeline.convert`` of the wrapped op on ONNX Runtime (validated against PyTorch), then the real
    TensorRT-RTX build of ``module.onnx``; ``dtype="float16"`` converts with ``precision="fp16"``."""
    model = Wrap(op, sample).eval()
    torch.manual_seed(0)
    try:
        with time_limit(timeout), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            module = pipeline.convert(model, model.tensors, backend="onnxruntime", precision=PRECISIONS[dtype])
            return _rtx_outcome(module.onnx, module.settings.dynamic, op)
    except Exception as exc:  # classified: our errors by stage, anything else is a crash
        return classify_error(exc, op)
    except CaseTimeout as exc:
        return classify_error(exc, op)


def _root_cause(exc: BaseException) -> BaseException:
    seen = {id(exc)}
    while exc.__cause__ is not None and id(exc.__cause__) not in seen:
        exc = exc.__cause__
        seen.add(id(exc))
    return exc


def run_plain(op: Any, sample: Any, timeout: float | None = None) -> Outcome:
    """Plain ``torch.onnx.export(dynamo=True)`` of the wrapped op, then the real TensorRT-RTX build (nothing is
    compared with PyTorch): "ok" when it builds, "export" with the exporter's root cause, "parser"/"build"."""
    model = Wrap(op, sample).eval()
    torch.manual_seed(0)
    try:
        with time_limit(timeout), warnings.catch_warnings(), contextlib.redirect_stdout(None):
            warnings.simplefilter("ignore")
            try:
                program = torch.onnx.export(model, model.tensors, dynamo=True, verbose=False)
            except Exception as exc:  # the exporter's own errors: keep the innermost reason
                root = _root_cause(exc)
                return Outcome("export", one_line(f"{type(root).__name__}: {root}"), True)
            assert program is not None
            return _rtx_outcome(program.model_proto, (), op)
    except Exception as exc:  # a raw error of the build step
        return Outcome("crash", one_line(f"{type(exc).__name__}: {exc}"), False)
    except CaseTimeout as exc:
        return classify_error(exc, op)


@dataclass(frozen=True)
class OpResult:
    """One op's row: ours and plain export's outcome over its samples (the first that is not ok, else ok)."""

    op: str
    ours: Outcome
    plain: Outcome
    samples: int
    seconds: float


def worst(outcomes: list[Outcome]) -> Outcome:
    """The first outcome that is not ok (with its sample's index in the reason when there are several), else ok."""
    for index, outcome in enumerate(outcomes):
        if not outcome.ok:
            if len(outcomes) == 1:
                return outcome
            return Outcome(outcome.status, f"sample {index}: {outcome.reason}", outcome.names_op)
    return Outcome("ok")


def run_op(name: str, samples: int = 1, dtype: str = "float32", plain: bool = True, timeout: float = 120) -> OpResult:
    """The row of the coverage table for one op: its first ``samples`` usable samples through ours and plain."""
    start = time.perf_counter()
    op = all_ops()[name]
    found, why = usable_samples(op, samples)
    if not found:
        none = Outcome("no usable sample", why)
        return OpResult(name, none, none, 0, time.perf_counter() - start)
    ours = worst([run_ours(op, s, dtype, timeout) for s in found])
    theirs = worst([run_plain(op, s, timeout) for s in found]) if plain else Outcome("not run")
    return OpResult(name, ours, theirs, len(found), time.perf_counter() - start)
