"""A Python branch on tensor data exported as the sample takes it, when torch.export cannot trace the branch.

Some models decide in Python on a value of their inputs' data: FSMT's padding mask (``if not padding_mask.any():
padding_mask = None``), LED's and Longformer's global attention (``is_global_attn = mask.flatten().any().item()``,
then ``if is_global_attn:``). A graph cannot hold the decision, and torch.export fails with
``GuardOnDataDependentSymNode ... Eq(u0, 1)``. Each such decision is usually fixed by what the call passes (no pad
token in the decoder input, no global attention mask), so the graph of the branch the sample takes is the model for
those calls.

When torch.export fails that way, :func:`recorded_branches` runs the model once more, eagerly, and records at each
of the model's source lines the values of ``bool(t)`` and ``t.item()`` where ``t`` is an ``any()`` or ``all()`` of a
tensor (whether a mask holds a pad, a global token: the idiom of these branches), in call order; the
export is then traced again within :func:`branches_as_recorded`, where each such call that torch.export cannot
decide returns the recorded value (each call at a line takes the next value recorded there). Calls it can decide
are traced as before. The decisions taken are logged, named by source line, and written into the conversion report
(``report.traced_branches``); the conversion's validation compares the graph with PyTorch on the sample and on
inputs drawn like it. An input that would take the other branch (a pad token in FSMT's decoder input) gets the
traced branch's result: convert with a sample that takes the branch those inputs need.

Other decisions on sizes computed from data (LightOnOCR's patch count from ``image_sizes``, then transformers'
``is_causal = q_length > 1 and ...``) are not calls a mode sees. When the export fails on one even with the recorded
branches, :func:`real_values_decide` traces once more with PyTorch's real-tensor propagation (what
``torch.export.draft_export`` does): each guard on a data-dependent expression is decided by the sample's real values
(torch.export keeps a runtime assertion of it in the program; the ONNX graph does not). Only decisions on sizes are
taken (:func:`decided_sizes`): one on a float or bool read from a tensor (``if x.sum() > 0:``) stays the export
error. Each decision is written into the report as above, by the model's source line and the expression
(``sdpa_attention.py:148 in sdpa_attention_forward `is_causal = ...`: u1*u3 > 1`` -> ``True``), and validation
compares the graph with PyTorch as for the recorded branches.
"""

from __future__ import annotations

import contextlib
import linecache
import logging
import sys
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import torch
import torch._functorch.config
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode, free_unbacked_symbols
from torch.overrides import TorchFunctionMode

from pipeline.exporting.errors import is_model_code

logger = logging.getLogger(__name__)

_BOOL = torch.Tensor.__bool__
_ITEM = torch.Tensor.item
_REDUCTIONS = (torch.Tensor.any, torch.any, torch.Tensor.all, torch.all)

#: a source line of the model: (file, line, function)
Site = tuple[str, int, str]


@dataclass
class Branches:
    """The values ``bool(tensor)`` and bool ``.item()`` gave at each of the model's lines when it ran eagerly, and
    the ones an export took (:func:`branches_as_recorded`): ``modeling_fsmt.py:266 in make_padding_mask `if not
    padding_mask.any():``` -> ``False``."""

    recorded: dict[Site, list[bool]]
    taken: dict[str, str] = field(default_factory=dict)
    #: decisions on data-dependent expressions the sample's real values took (:func:`real_values_decide`): the
    #: model's line and the expression -> (the value, whether it decides on a value rather than a size)
    decided: dict[str, tuple[str, bool]] = field(default_factory=dict)


def branches_on_data(exc: BaseException) -> bool:
    """Whether torch.export failed on a Python decision on tensor data (a guard on a data-dependent symbol)."""
    current: BaseException | None = exc
    seen: set[int] = set()
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, GuardOnDataDependentSymNode):
            return True
        current = current.__cause__ or current.__context__
    return "GuardOnDataDependentSymNode" in str(exc)


def recorded_branches(model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Branches:
    """Run ``model`` eagerly and record its decisions on tensor data (module doc)."""
    recorder = _Recorder()
    with recorder:
        model(*args, **kwargs)
    return Branches(dict(recorder.values))


@contextlib.contextmanager
def branches_as_recorded(branches: Branches | None) -> Iterator[None]:
    """Within the block, a decision on tensor data that torch.export cannot trace takes the value recorded at its
    line (module doc); nothing changes when ``branches`` is None."""
    if branches is None:
        yield
        return
    with _Replay(branches):
        yield


@contextlib.contextmanager
def real_values_decide(branches: Branches) -> Iterator[None]:
    """Within the block, torch.export decides each guard on data-dependent sizes by the sample's real values (module
    doc); the decisions are kept in ``branches.decided`` for :func:`decided_sizes` to accept or refuse."""
    shapes_logger = logging.getLogger("torch.fx.experimental.symbolic_shapes")

    def decided(record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith("propagate_real_tensors evaluate_expr") or len(record.args or ()) != 2:
            return True  # another message: shown as before
        expr, value = record.args  # type: ignore[misc]
        site = _call_site(sys._getframe(1))
        key = f"{_site_text(site) if site is not None else 'the model'}: {expr}"
        branches.decided[key] = (str(value), _on_values(expr, _shape_env(sys._getframe(1))))
        return False  # torch's own warning: decided_sizes says it with the model's line

    shapes_logger.addFilter(decided)
    try:
        with torch._functorch.config.patch(fake_tensor_propagate_real_tensors=True):
            yield
    finally:
        shapes_logger.removeFilter(decided)


def _shape_env(frame: FrameType | None) -> Any:
    """The ShapeEnv logging the decision: the ``self`` of the innermost frame that has one."""
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    while frame is not None:
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, ShapeEnv):
            return candidate
        frame = frame.f_back
    return None


def _on_values(expr: Any, shape_env: Any) -> bool:
    """Whether ``expr`` decides on a value rather than a size: one of its symbols is a float read with ``.item()``
    (``zuf0``) or a bool (its range 0..1: ``if x.sum() > 0:``, ``if (x == 0).any():``)."""
    ranges = getattr(shape_env, "var_to_range", {})
    for symbol in getattr(expr, "free_symbols", ()):
        if str(symbol).startswith(("zuf", "zf")):
            return True
        bounds = ranges.get(symbol)
        if bounds is not None and bounds.lower >= 0 and bounds.upper <= 1:
            return True
    return False


def decided_sizes(branches: Branches) -> list[str]:
    """Accept the decisions :func:`real_values_decide` took when all are on sizes: each is logged and added to
    ``branches.taken``. Returns the decisions on values instead (a float or bool read with ``.item()``:
    ``if duration.sum() == 0:``), which an input's values would decide otherwise; nothing is accepted then (the
    export's error stands)."""
    on_values = [key for key, (_, values) in branches.decided.items() if values]
    if on_values:
        return on_values
    new = {key: value for key, (value, _) in branches.decided.items() if key not in branches.taken}
    if new:
        logger.warning(
            "%d decision(s) on sizes computed from tensor data, which a graph cannot hold, exported as the sample "
            "takes them: %s; inputs whose sizes would decide otherwise get these decisions' graph (convert with a "
            "sample like them)",
            len(new),
            "; ".join(f"{key} -> {value}" for key, value in new.items()),
        )
    branches.taken.update({key: value for key, (value, _) in branches.decided.items()})
    return []


def _site_text(site: Site) -> str:
    filename, line, function = site
    where = f"{filename.rsplit('/', 1)[-1]}:{line} in {function}"
    source = linecache.getline(filename, line).strip()
    return f"{where} `{source}`" if source else where


def _call_site(start: FrameType | None = None) -> Site | None:
    """The innermost frame of the model's own Python on the stack (not torch's, ours or the standard library's),
    from ``start`` (the caller's caller by default) outwards."""
    frame = start if start is not None else sys._getframe(2)
    while frame is not None:
        code = frame.f_code
        if is_model_code(code.co_filename):
            return code.co_filename, frame.f_lineno, code.co_name
        frame = frame.f_back  # type: ignore[assignment]
    return None


def _decides(func: Any, args: tuple[Any, ...]) -> bool:
    """``bool(tensor)``, or ``.item()`` of a bool tensor (a flag the model branches on later)."""
    if func is _BOOL:
        return True
    return func is _ITEM and bool(args) and isinstance(args[0], torch.Tensor) and args[0].dtype == torch.bool


class _Recorder(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.values: dict[Site, list[bool]] = defaultdict(list)
        self.reductions: dict[int, torch.Tensor] = {}  # any()/all() results by id (held: ids stay unique)

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        result = func(*args, **(kwargs or {}))
        if func in _REDUCTIONS and isinstance(result, torch.Tensor):
            self.reductions[id(result)] = result
        elif _decides(func, args) and id(args[0]) in self.reductions:
            site = _call_site()
            if site is not None:
                self.values[site].append(bool(result))
        return result


class _Replay(TorchFunctionMode):
    def __init__(self, branches: Branches) -> None:
        super().__init__()
        self.branches = branches
        self.calls: Counter[Site] = Counter()

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        if not _decides(func, args):
            return func(*args, **kwargs)
        site = _call_site()
        values = self.branches.recorded.get(site) if site is not None else None
        if site is None or not values:
            return func(*args, **kwargs)
        index = self.calls[site]
        self.calls[site] += 1
        value = values[min(index, len(values) - 1)]
        if func is _BOOL:
            try:
                return func(*args, **kwargs)
            except GuardOnDataDependentSymNode:
                pass
        else:
            result = func(*args, **kwargs)
            if not (isinstance(result, torch.SymBool) and free_unbacked_symbols(result)):
                return result
        self._taken(site, value)
        return value

    def _taken(self, site: Site, value: bool) -> None:
        key = _site_text(site)
        before = self.branches.taken.get(key)
        if before is None:
            logger.warning(
                "%s decides on tensor data, which a graph cannot: exported as the sample takes it (%s); inputs that "
                "would take the other branch get this branch's result (convert with a sample that takes the branch "
                "they need)",
                key,
                value,
            )
        self.branches.taken[key] = str(value) if before in (None, str(value)) else "True and False (by call)"
