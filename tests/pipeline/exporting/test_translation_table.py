"""The exporter's translation table is built once per opset and process, not once per export: the graphs are the
ones a fresh table gives, a custom translation stays with the export that asked for it, and an operator
registered later (a custom op library, torchvision imported late) makes the next export build a new table."""

from __future__ import annotations

from typing import Any

import onnx
import torch
from onnxscript import opset18 as op
from torch import nn

import pipeline
from pipeline.exporting.translation_table import kept_tables, reused_translation_table


class SinPlusMean(nn.Module):
    """forward(x) = sin(x) + mean(x, -1, keepdim)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(x) + x.mean(-1, keepdim=True)


def _ops(program: torch.onnx.ONNXProgram) -> list[str]:
    return [node.op_type for node in program.model_proto.graph.node]


def _export(custom: dict | None = None) -> torch.onnx.ONNXProgram:
    sample = (torch.randn(2, 3),)
    model = SinPlusMean().eval()
    program = torch.onnx.export(model, sample, dynamo=True, custom_translation_table=custom, report=False)
    assert program is not None
    return program


def cos(x: Any) -> Any:
    """A translation of aten.sin that writes Cos (so that the test can see which table an export used)."""
    return op.Cos(x)


def test_reused_table_gives_the_same_graph_and_keeps_custom_translations_to_their_export() -> None:
    plain = _export()
    with reused_translation_table():
        first = _export()
        custom = _export({torch.ops.aten.sin.default: cos})
        after = _export()
    assert onnx.printer.to_text(first.model_proto.graph) == onnx.printer.to_text(plain.model_proto.graph)
    assert "Sin" in _ops(first) and "Cos" not in _ops(first)
    assert "Cos" in _ops(custom) and "Sin" not in _ops(custom)
    assert "Sin" in _ops(after) and "Cos" not in _ops(after), "a custom translation leaked into the kept table"


def test_an_operator_registered_later_rebuilds_the_table() -> None:
    with reused_translation_table():
        program = _export()
    opset = next(o.version for o in program.model_proto.opset_import if o.domain in ("", "ai.onnx"))
    before = kept_tables()[opset]
    library = torch.library.Library("translation_table_test", "FRAGMENT")  # noqa: F841 (keeps the op registered)
    library.define("late(Tensor x) -> Tensor")
    with reused_translation_table():
        _export()
    assert kept_tables()[opset] > before


def test_pipeline_conversions_match_with_the_kept_table() -> None:
    model = SinPlusMean().eval()
    sample = torch.randn(4, 5)
    first = pipeline.convert(model, sample)
    second = pipeline.convert(model, sample)
    torch.testing.assert_close(second(sample), model(sample))
    assert [n.op_type for n in first.onnx.graph.node] == [n.op_type for n in second.onnx.graph.node]


def test_torchlib_is_listed_without_parsing_as_onnxscript_lists_it() -> None:
    """The translation table's functions, listed from each function's opset (pipeline.exporting.translation_table),
    are onnxscript's own list: the same functions, names, domains and kinds, in the same order."""
    from torch.onnx._internal._lazy_import import onnxscript_apis

    from pipeline.exporting.translation_table import listed_without_parsing

    def listing() -> list[tuple]:
        return [
            (m.qualified_name, m.function, m.domain, m.name, m.is_complex) for m in onnxscript_apis.get_torchlib_ops()
        ]

    want = listing()
    with listed_without_parsing():
        got = listing()
    assert len(got) > 500 and got == want


def test_a_custom_translation_is_described_once_and_used_by_each_export() -> None:
    """The exporter derives a custom translation's signature on every export; the kept description is the same
    object the next export registers, and each export still writes that translation (or not, without it)."""
    from torch.onnx._internal.exporter import _registration

    seen: list[Any] = []
    register = _registration.ONNXRegistry._register

    def spy(self: Any, target: Any, description: Any) -> None:
        if getattr(description, "onnx_function", None) is cos:
            seen.append(description)
        register(self, target, description)

    _registration.ONNXRegistry._register = spy  # type: ignore[method-assign]
    try:
        with reused_translation_table():
            first = _export({torch.ops.aten.sin.default: cos})
            second = _export({torch.ops.aten.sin.default: cos})
            without = _export()
    finally:
        _registration.ONNXRegistry._register = register  # type: ignore[method-assign]
    assert len(seen) == 2 and seen[0] is seen[1], seen
    assert seen[0].is_custom and seen[0].signature is not None
    assert "Cos" in _ops(first) and "Cos" in _ops(second) and "Sin" in _ops(without) and "Cos" not in _ops(without)


def test_overlapping_blocks_restore_the_exporters_own_methods() -> None:
    """Exports in threads open overlapping blocks: the first block closed leaves the patch to the one still open,
    and the last one closed puts back the exporter's own methods (not another block's patch)."""
    from torch.onnx._internal.exporter import _registration

    registry = _registration.ONNXRegistry
    own = (registry.__dict__["from_torchlib"], registry.__dict__["register_op"])
    first, second = reused_translation_table(), reused_translation_table()
    first.__enter__()
    second.__enter__()
    patched = registry.__dict__["register_op"]
    assert patched is not own[1]
    first.__exit__(None, None, None)
    assert registry.__dict__["register_op"] is patched  # the other block is still open
    second.__exit__(None, None, None)
    assert registry.__dict__["from_torchlib"] is own[0] and registry.__dict__["register_op"] is own[1]
