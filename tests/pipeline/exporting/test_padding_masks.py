"""A Python branch on tensor data in a model's mask code (FSMT's ``if not padding_mask.any():``, LED's
``is_global_attn = ....any().item()``), which torch.export cannot trace (``GuardOnDataDependentSymNode``), is
exported as the sample takes it: the model converts, matches PyTorch, and the report names the line and the value.
Tiny models with random weights, built from their configs (nothing downloaded)."""

from __future__ import annotations

import pytest
import tests_environment  # noqa: F401 -- torchvision's operator schemas, before transformers' models
import torch
import transformers

import pipeline
from pipeline.exporting.stage import export
from pipeline.settings import Settings

SEQ2SEQ = {"encoder_layers": 1, "decoder_layers": 1, "encoder_attention_heads": 2, "decoder_attention_heads": 2}
FFN = {"encoder_ffn_dim": 64, "decoder_ffn_dim": 64}


def ids(length: int, seed: int = 0) -> torch.Tensor:
    """Token ids from 3 on: no pad token (FSMT's is 1), as a tokenizer gives for an unpadded sentence."""
    return torch.randint(3, 100, (1, length), generator=torch.Generator().manual_seed(seed))


def test_fsmt_padding_mask_branch_is_exported_as_the_sample_takes_it() -> None:
    """With ``use_cache=False`` FSMT makes its decoder's padding mask, and drops it when the input has no pad."""
    config = transformers.FSMTConfig(
        src_vocab_size=128, tgt_vocab_size=128, d_model=32, **SEQ2SEQ, **FFN, max_position_embeddings=64,
        langs=["en", "de"], use_cache=False,
    )  # fmt: skip
    model = transformers.FSMTModel(config).eval()
    sample = {"input_ids": ids(8), "decoder_input_ids": ids(4, seed=1)}

    module = pipeline.convert(model, ((), sample), validation_inputs=2)

    branches = module.report.traced_branches
    assert list(branches.values()) == ["False"]
    (where,) = branches
    assert where.startswith("modeling_fsmt.py:") and "in make_padding_mask `if not padding_mask.any():`" in where
    assert f"branch    {where} -> False" in module.report.summary()
    assert module.report.accuracy is not None and module.report.accuracy.passed
    other = {"input_ids": ids(8, seed=2), "decoder_input_ids": ids(4, seed=3)}
    with torch.no_grad():
        want = model(**other)
    got = module(**other)
    torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state, rtol=1e-4, atol=1e-5)


def test_led_global_attention_flag_is_exported_as_the_sample_takes_it() -> None:
    """LED asks ``.item()`` of whether any token has global attention, then branches on it in every layer; without
    a global attention mask, none has. (torch.export and the ONNX translation succeed; the exporter's ONNX for LED's
    sliding-window attention does not match PyTorch yet, which the conversion's validation reports.)"""
    config = transformers.LEDConfig(
        vocab_size=128, d_model=32, **SEQ2SEQ, **FFN, max_encoder_position_embeddings=64,
        max_decoder_position_embeddings=64, attention_window=[4], use_cache=False,
    )  # fmt: skip
    model = transformers.LEDModel(config).eval()
    sample = {"input_ids": ids(8), "decoder_input_ids": ids(4, seed=1)}

    exported = export(model, ((), sample), Settings())

    (where,) = exported.traced_branches
    assert where.startswith("modeling_led.py:") and "is_global_attn = is_index_global_attn" in where
    assert exported.traced_branches[where] == "False"
    assert [o.name for o in exported.model.graph.output] == ["last_hidden_state", "encoder_last_hidden_state"]


class _CropBySize(torch.nn.Module):
    """Crops its patches to the count its second input holds (as Pixtral crops to ``image_sizes``), then decides in
    Python on that count (as transformers' ``is_causal = q_length > 1 and ...``): a guard on a size computed from
    data, which no recorded ``any()`` explains."""

    def forward(self, patches: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
        kept = patches[:, : count[0].item()]
        if kept.shape[1] > 1:
            return kept.softmax(dim=1)
        return kept


def test_a_size_computed_from_data_is_decided_by_the_sample(capfd) -> None:  # type: ignore[no-untyped-def]
    model = _CropBySize().eval()
    patches = torch.randn(1, 8, 4, generator=torch.Generator().manual_seed(0))

    module = pipeline.convert(model, (patches, torch.tensor([6])), validation_inputs=1)

    branches = module.report.traced_branches
    (where,) = (k for k in branches if "kept.shape[1] > 1" in k)
    assert where.startswith("test_padding_masks.py:") and branches[where] == "True"
    assert module.report.accuracy is not None and module.report.accuracy.passed
    other = torch.tensor([3])  # another count on the same side of the decision: the crop follows it
    torch.testing.assert_close(module(patches, other), model(patches, other))
    # torch.export prints each failed trace's partial graph to stderr: the retries' are not shown
    assert "def forward(self" not in capfd.readouterr().err


class _SqueezeFirst(torch.nn.Module):
    """Keeps as many rows as its second input says, then ``squeeze(0)``: a no-op in PyTorch unless one row is
    kept (Mistral 3's patch features), decided by the sample's count; ONNX ``Squeeze`` would refuse the axis."""

    def forward(self, rows: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
        return rows[: count[0].item()].squeeze(0) * 2.0


def test_a_squeeze_the_trace_decided_against_is_not_in_the_graph() -> None:
    model = _SqueezeFirst().eval()
    rows = torch.randn(6, 5, generator=torch.Generator().manual_seed(0))
    module = pipeline.convert(model, (rows, torch.tensor([4])), validation_inputs=1)
    assert not any(n.op_type == "Squeeze" for n in module.onnx.graph.node)
    assert module.report.accuracy is not None and module.report.accuracy.passed
    torch.testing.assert_close(module(rows, torch.tensor([3])), model(rows, torch.tensor([3])))


def test_tensorrt_rtx_builds_an_input_read_as_sizes_for_the_sample_values() -> None:
    """The count sizes the crop: TensorRT-RTX's parser makes it a shape tensor, whose values every profile must hold
    (without them its builder says only "Invalid Engine"). The conversion takes the sample's and says so; given
    values win; an input the parser marks without values is the BuildError naming it."""
    pytest.importorskip("tensorrt_rtx")
    patches = torch.randn(1, 8, 4, generator=torch.Generator().manual_seed(0))
    module = pipeline.convert(_CropBySize().eval(), (patches, torch.tensor([6])), backend="tensorrt-rtx")
    assert module.settings.shape_tensor_values == (("count", (6,)),)
    assert module.engine_bytes  # built by TensorRT-RTX
    given = pipeline.convert(
        _CropBySize().eval(), (patches, torch.tensor([6])), backend="tensorrt-rtx", shape_tensor_values={"count": [5]}
    )
    assert given.settings.shape_tensor_values == (("count", (5,)),) and given.engine_bytes


def test_a_shape_tensor_input_without_values_is_a_build_error_naming_it() -> None:
    pytest.importorskip("tensorrt_rtx")
    from converters.settings import Settings
    from pipeline.backends.tensorrt.build import parse_network
    from pipeline.backends.tensorrt.shape_inputs import profile_values
    from pipeline.runtime.tensorrt.library import TENSORRT_RTX

    patches = torch.randn(1, 8, 4, generator=torch.Generator().manual_seed(0))
    module = pipeline.convert(_CropBySize().eval(), (patches, torch.tensor([6])), validate=False)
    _, network, _ = parse_network(module.onnx, None, library=TENSORRT_RTX)
    assert profile_values(network, Settings(shape_tensor_values={"count": [6]})) == {"count": ((6,), (6,), (6,))}
    with pytest.raises(pipeline.BuildError, match=r"reads input\(s\) 'count' as shape tensors") as caught:
        profile_values(network, Settings())
    assert "shape_tensor_values={'count': [...]}" in caught.value.fix


class _DegenerateDurations(torch.nn.Module):  # FastSpeech2's length regulator, in small
    def forward(self, states: torch.Tensor, durations: torch.Tensor) -> torch.Tensor:
        if durations.sum() == 0:  # a decision on the durations' values, not on a size
            durations = durations + 1
        return states * durations.to(states.dtype)[:, None]


def test_a_decision_on_integer_values_stays_the_export_error() -> None:
    states = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
    with pytest.raises(pipeline.ExportError, match="data-dependent") as caught:
        pipeline.convert(_DegenerateDurations().eval(), (states, torch.tensor([1, 0, 2, 1])))
    assert "test_padding_masks.py:" in str(caught.value)  # the model's line


class _LengthsInASet(torch.nn.Module):
    """Lumina 2's joint-attention check, ``use_mask = len(set(seq_lengths)) > 1`` on lengths read from the mask."""

    def __init__(self, hashed: bool) -> None:
        super().__init__()
        self.hashed = hashed

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        lengths = mask.sum(1).tolist()
        use_mask = len(set(lengths)) > 1 if self.hashed else any(n != lengths[0] for n in lengths)
        return x * 2 if use_mask else x + 1


def test_lengths_read_from_data_in_a_set_name_the_line_and_the_fix_that_converts() -> None:
    x, mask = torch.randn(2, 4, generator=torch.Generator().manual_seed(0)), torch.ones(2, 4, dtype=torch.long)
    with pytest.raises(pipeline.ExportError, match="unhashable") as caught:
        pipeline.convert(_LengthsInASet(hashed=True).eval(), (x, mask))
    text = str(caught.value)
    assert "test_padding_masks.py:" in text and "any(n != lengths[0] for n in lengths)" in text
    assert "usual fixes" not in text
    module = pipeline.convert(_LengthsInASet(hashed=False).eval(), (x, mask))  # the fix the error names
    torch.testing.assert_close(module(x, mask), x + 1)
