"""``pipeline.convert`` on real models: real torch.onnx export, real passes, real ONNX Runtime, real Polygraphy.

Every test checks what a user would check after converting: the converted module, called like the original on
fresh inputs (never the sample, never the validation inputs), returns the same structure and types as PyTorch
with values within tolerance, and the report says what happened. Models are tiny (random weights, no hub
downloads); converted modules are shared through module-scoped fixtures to keep the file fast.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from model_zoo import (
    CNN,
    MLP,
    DictOut,
    Gated,
    KeywordOnly,
    ListOut,
    TwoInTwoOut,
    bert_inputs,
    fresh,
    hf_resnet_model,
    hf_vit_model,
    make_cnn,
    tiny_bert_config,
)
from rtx_build import assert_builds
from torch import nn

import pipeline
from passes import default_passes

transformers = pytest.importorskip("transformers")

RTOL, ATOL = 1e-4, 1e-5
BACKEND = "onnxruntime"


# -- helpers -------------------------------------------------------------------------------------------------------


def convert(model: nn.Module, sample: Any, **settings: Any) -> pipeline.ConvertedModule:
    return pipeline.convert(model, sample, backend=BACKEND, **settings)


def reference(model: nn.Module, *args: Any, **kwargs: Any) -> Any:
    with torch.no_grad():
        return model(*args, **kwargs)


def assert_same_tree(got: Any, want: Any, path: str = "output", rtol: float = RTOL, atol: float = ATOL) -> None:
    """Same container types (tuple/list/dict/ModelOutput), same keys in the same order, None kept, close tensors."""
    if want is None:
        assert got is None, f"{path}: expected None, got {type(got).__name__}"
    elif isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"{path}: expected a tensor, got {type(got).__name__}"
        assert got.dtype == want.dtype, f"{path}: dtype {got.dtype} != {want.dtype}"
        assert got.shape == want.shape, f"{path}: shape {tuple(got.shape)} != {tuple(want.shape)}"
        assert got.device == want.device, f"{path}: device {got.device} != {want.device}"
        torch.testing.assert_close(got, want, rtol=rtol, atol=atol, msg=lambda m: f"{path}: {m}")
    elif isinstance(want, dict):  # includes transformers' ModelOutput (an OrderedDict subclass)
        assert type(got) is type(want), f"{path}: type {type(got).__name__} != {type(want).__name__}"
        assert list(got.keys()) == list(want.keys()), f"{path}: keys {list(got.keys())} != {list(want.keys())}"
        for key in want:
            assert_same_tree(got[key], want[key], f"{path}[{key!r}]", rtol, atol)
    elif isinstance(want, tuple | list):
        assert type(got) is type(want), f"{path}: type {type(got).__name__} != {type(want).__name__}"
        assert len(got) == len(want), f"{path}: length {len(got)} != {len(want)}"
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same_tree(g, w, f"{path}[{i}]", rtol, atol)
    else:
        raise AssertionError(f"{path}: unexpected leaf {want!r} in the PyTorch output")


def onnx_input_shape(module: pipeline.ConvertedModule, name: str) -> list[int | str]:
    (value,) = [v for v in module.onnx.graph.input if v.name == name]
    return [d.dim_param if d.HasField("dim_param") else d.dim_value for d in value.type.tensor_type.shape.dim]


def assert_report_passed(module: pipeline.ConvertedModule, *, validation_inputs: int = 4) -> None:
    report = module.report
    assert report.backend == BACKEND
    assert report.accuracy is not None
    assert report.accuracy.passed
    assert report.accuracy.inputs == validation_inputs
    assert [o.name for o in report.accuracy.outputs] == [o.name for o in module.io.outputs]
    for o in report.accuracy.outputs:
        assert o.passed, o
        assert np.isfinite(o.max_abs) and o.max_abs >= 0, o


# -- fixtures: one conversion per model, shared by the tests that use it -------------------------------------------


@pytest.fixture(scope="module")
def mlp() -> tuple[MLP, pipeline.ConvertedModule]:
    torch.manual_seed(0)
    model = MLP().eval()
    return model, convert(model, torch.randn(3, 8))


@pytest.fixture(scope="module")
def cnn() -> tuple[CNN, pipeline.ConvertedModule]:
    model = make_cnn()
    return model, convert(model, torch.randn(2, 3, 16, 16))


@pytest.fixture(scope="module")
def cnn_dynamic() -> tuple[CNN, pipeline.ConvertedModule]:
    model = make_cnn(seed=1)
    return model, convert(model, torch.randn(2, 3, 16, 16), dynamic={"x": {0: ("batch", 1, 2, 16)}})


@pytest.fixture(scope="module")
def bert() -> tuple[nn.Module, pipeline.ConvertedModule]:
    torch.manual_seed(0)
    model = transformers.BertModel(tiny_bert_config()).eval()
    sample = bert_inputs(2, 8, seed=0, lengths=[8, 5])  # a dict: the kwargs of the call, as from a tokenizer
    return model, convert(model, sample)


BERT_DIMS = {0: ("batch", 1, 2, 4), 1: ("seq", 1, 8, 16)}
BERT_DYNAMIC = {name: BERT_DIMS for name in ("input_ids", "attention_mask", "token_type_ids")}


@pytest.fixture(scope="module")
def bert_dynamic() -> tuple[nn.Module, pipeline.ConvertedModule]:
    torch.manual_seed(1)
    model = transformers.BertModel(tiny_bert_config()).eval()
    # a sample of equal-length sequences (no padding); padded batches are run after conversion
    sample = ((), bert_inputs(2, 8, seed=1, lengths=[8, 8]))
    return model, convert(model, sample, dynamic=BERT_DYNAMIC)


# -- 1. MLP ----------------------------------------------------------------------------------------------------------


def test_mlp_matches_pytorch_on_fresh_inputs(mlp: tuple[MLP, pipeline.ConvertedModule]) -> None:
    model, module = mlp
    assert isinstance(module, nn.Module)
    for seed in (11, 12, 13):
        x = fresh(3, 8, seed=seed) * 3
        got = module(x)
        assert isinstance(got, torch.Tensor)
        assert_same_tree(got, reference(model, x))


def test_mlp_report(mlp: tuple[MLP, pipeline.ConvertedModule]) -> None:
    _, module = mlp
    report = module.report
    assert report.backend == "onnxruntime"
    assert "requested" in report.backend_reason
    assert [name for name, _ in report.stages] == ["export", "passes", "check", "build", "validate"]
    assert all(seconds >= 0 for _, seconds in report.stages)
    assert report.total_seconds == pytest.approx(sum(s for _, s in report.stages))

    # every default pass ran at least once, and the node counts chain from the exported to the final graph
    assert {p.name for p in default_passes()} <= {r.name for r in report.passes}
    assert report.passes[0].nodes_before == report.nodes_exported
    for before, after in zip(report.passes, report.passes[1:], strict=False):
        assert after.nodes_before == before.nodes_after
    assert report.passes[-1].nodes_after == report.nodes_final == len(module.onnx.graph.node)
    assert all(r.modified for r in report.passes if r.nodes_before != r.nodes_after)

    # sample + 3 seeded random inputs, fp32 default tolerances, one output
    assert_report_passed(module, validation_inputs=4)
    (out,) = report.accuracy.outputs
    fp32 = pipeline.DEFAULT_TOLERANCES["float32"]
    assert (out.atol, out.rtol) == (fp32.atol, fp32.rtol)
    assert out.dtype == "float32"
    assert out.max_abs <= out.atol or out.max_rel <= out.rtol

    summary = report.summary()
    for text in ("onnxruntime", "export", "validate", "PASS", out.name, f"{report.nodes_exported} nodes exported"):
        assert text in summary, (text, summary)


def test_mlp_onnx_graph_is_valid_and_runs_alone(mlp: tuple[MLP, pipeline.ConvertedModule]) -> None:
    model, module = mlp
    assert isinstance(module.onnx, onnx.ModelProto)
    onnx.checker.check_model(module.onnx)
    assert [i.name for i in module.onnx.graph.input] == ["x"]
    assert onnx_input_shape(module, "x") == [3, 8]
    session = ort.InferenceSession(module.onnx.SerializeToString(), providers=["CPUExecutionProvider"])
    x = fresh(3, 8, seed=21)
    (got,) = session.run(None, {"x": x.numpy()})
    torch.testing.assert_close(torch.from_numpy(got), reference(model, x), rtol=RTOL, atol=ATOL)


def test_static_batch_rejects_another_batch_size(mlp: tuple[MLP, pipeline.ConvertedModule]) -> None:
    _, module = mlp
    with pytest.raises(pipeline.InputError, match=r"'x'.*size 5 on axis 0.*fixed size 3"):
        module(fresh(5, 8, seed=0))


def test_wrong_dtype_is_an_input_error(mlp: tuple[MLP, pipeline.ConvertedModule]) -> None:
    _, module = mlp
    with pytest.raises(pipeline.InputError, match=r"'x' is float64, the graph takes float32"):
        module(fresh(3, 8, seed=0).double())


# -- 2. CNN with batch norm and pooling --------------------------------------------------------------------------------


def test_cnn_with_batchnorm_matches_pytorch(cnn: tuple[CNN, pipeline.ConvertedModule]) -> None:
    model, module = cnn
    for seed in (31, 32):
        x = fresh(2, 3, 16, 16, seed=seed)
        assert_same_tree(module(x), reference(model, x))
    assert_report_passed(module)


def test_cnn_uses_running_statistics_not_batch_statistics(cnn: tuple[CNN, pipeline.ConvertedModule]) -> None:
    # eval-mode batch norm: an image's result does not depend on the other images of the batch
    model, module = cnn
    x = fresh(2, 3, 16, 16, seed=33)
    batched = module(x)
    swapped = module(x.flip(0))
    torch.testing.assert_close(swapped.flip(0), batched, rtol=RTOL, atol=ATOL)
    bn = model.features[1]
    assert not torch.allclose(bn.running_mean, torch.zeros_like(bn.running_mean))  # the stats really are non-trivial


def test_training_mode_model_is_converted_in_eval_mode_and_left_training(caplog: pytest.LogCaptureFixture) -> None:
    model = make_cnn(seed=2).train()
    stats_before = {k: v.clone() for k, v in model.state_dict().items()}
    with caplog.at_level(logging.WARNING, logger="pipeline"):
        module = convert(model, torch.randn(2, 3, 16, 16))
    assert "training mode" in caplog.text
    assert model.training, "convert must give the model back in the mode it was in"
    assert all(m.training for m in model.modules())
    for key, value in model.state_dict().items():
        assert torch.equal(value, stats_before[key]), f"convert changed {key}"
    x = fresh(2, 3, 16, 16, seed=34)
    assert_same_tree(module(x), reference(model.eval(), x))


# -- 3. nn.TransformerEncoderLayer -------------------------------------------------------------------------------------


def test_transformer_encoder_layer_batch_first() -> None:
    torch.manual_seed(0)
    model = nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32, dropout=0.1, batch_first=True).eval()
    module = convert(model, torch.randn(2, 5, 16))
    assert [t.name for t in module.io.inputs] == ["src"]
    assert_report_passed(module)
    assert_builds(module)  # the real TensorRT-RTX builder builds the final graph
    for seed in (41, 42):
        src = fresh(2, 5, 16, seed=seed)
        assert_same_tree(module(src), reference(model, src))


# -- 4. transformers BERT, kwargs from a dict -------------------------------------------------------------------------


def test_bert_returns_the_same_model_output(bert: tuple[nn.Module, pipeline.ConvertedModule]) -> None:
    model, module = bert
    assert [t.name for t in module.io.inputs] == ["input_ids", "attention_mask", "token_type_ids"]
    assert [t.dtype for t in module.io.inputs] == ["int64"] * 3
    for seed, lengths in ((51, [8, 3]), (52, [1, 8])):
        inputs = bert_inputs(2, 8, seed=seed, lengths=lengths)
        got = module(**inputs)
        want = reference(model, **inputs)
        assert type(got) is type(want)
        assert isinstance(got, transformers.modeling_outputs.BaseModelOutputWithPoolingAndCrossAttentions)
        assert list(got.keys()) == list(want.keys()) == ["last_hidden_state", "pooler_output"]
        assert_same_tree(got, want)
        # attribute, key and index access all work like on the PyTorch output
        assert got.last_hidden_state is got["last_hidden_state"] is got[0]
        assert got.attentions is None
        torch.testing.assert_close(got.pooler_output, want.pooler_output, rtol=RTOL, atol=ATOL)


def test_bert_report(bert: tuple[nn.Module, pipeline.ConvertedModule]) -> None:
    _, module = bert
    assert_report_passed(module)
    assert [o.name for o in module.report.accuracy.outputs] == ["last_hidden_state", "pooler_output"]
    assert module.report.nodes_final <= module.report.nodes_exported


# -- 5. two inputs, a tuple of outputs ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_in_two_out() -> tuple[TwoInTwoOut, pipeline.ConvertedModule]:
    torch.manual_seed(0)
    model = TwoInTwoOut().eval()
    return model, convert(model, (torch.randn(4, 6), torch.randn(4, 6)))


def test_two_inputs_tuple_of_outputs(two_in_two_out: tuple[TwoInTwoOut, pipeline.ConvertedModule]) -> None:
    model, module = two_in_two_out
    assert [i.name for i in module.onnx.graph.input] == ["x", "y"]
    assert [o.name for o in module.onnx.graph.output] == ["out_0", "out_1"]
    assert_report_passed(module)
    x, y = fresh(4, 6, seed=61), fresh(4, 6, seed=62)
    got = module(x, y)
    assert isinstance(got, tuple) and len(got) == 2
    assert_same_tree(got, reference(model, x, y))
    assert_same_tree(module(x, y=y), reference(model, x, y))
    assert_same_tree(module(y=y, x=x), reference(model, x, y))


def test_a_number_where_the_sample_had_a_tensor_is_an_input_error(
    two_in_two_out: tuple[TwoInTwoOut, pipeline.ConvertedModule],
) -> None:
    _, module = two_in_two_out
    with pytest.raises(pipeline.InputError, match="must be a tensor"):
        module(fresh(4, 6, seed=63), 2.0)


def test_missing_argument_is_an_input_error(two_in_two_out: tuple[TwoInTwoOut, pipeline.ConvertedModule]) -> None:
    _, module = two_in_two_out
    with pytest.raises(pipeline.InputError):
        module(fresh(4, 6, seed=64))


# -- 6. dict and list outputs, None kept -------------------------------------------------------------------------------


def test_dict_output_with_nested_list_and_none() -> None:
    torch.manual_seed(0)
    model = DictOut().eval()
    module = convert(model, torch.randn(3, 5))
    assert_report_passed(module)
    assert_builds(module)  # the real TensorRT-RTX builder builds the final graph
    x = fresh(3, 5, seed=71)
    got = module(x)
    assert type(got) is dict
    assert list(got) == ["logits", "hidden", "attentions"]
    assert type(got["hidden"]) is list and len(got["hidden"]) == 2
    assert got["attentions"] is None
    assert_same_tree(got, reference(model, x))
    # only the tensors are graph outputs, named after their paths
    assert [o.name for o in module.onnx.graph.output] == ["logits", "hidden_0", "hidden_1"]


def test_list_output_with_none() -> None:
    torch.manual_seed(0)
    model = ListOut().eval()
    module = convert(model, torch.randn(3, 5))
    assert_report_passed(module)
    assert_builds(module)  # the real TensorRT-RTX builder builds the final graph
    x = fresh(3, 5, seed=72)
    got = module(x)
    assert type(got) is list and len(got) == 3
    assert got[1] is None
    assert_same_tree(got, reference(model, x))
    assert [o.name for o in module.onnx.graph.output] == ["out_0", "out_2"]


# -- 7. dynamic shapes -------------------------------------------------------------------------------------------------


def test_dynamic_batch_runs_at_other_batch_sizes(cnn_dynamic: tuple[CNN, pipeline.ConvertedModule]) -> None:
    model, module = cnn_dynamic
    for batch in (1, 7, 16):
        x = fresh(batch, 3, 16, 16, seed=80 + batch)
        got = module(x)
        assert got.shape == (batch, 5)
        assert_same_tree(got, reference(model, x))


def test_dynamic_batch_graph_input_is_symbolic(cnn_dynamic: tuple[CNN, pipeline.ConvertedModule]) -> None:
    _, module = cnn_dynamic
    assert onnx_input_shape(module, "x") == ["batch", 3, 16, 16]
    assert module.io.inputs[0].shape == ("batch", 3, 16, 16)
    assert module.io.outputs[0].shape[0] == "batch"  # the user's name, not the exporter's symbol (s31)
    # validation ran the sample, 3 random inputs, and one input at batch=min and one at batch=max
    assert_report_passed(module, validation_inputs=6)


def test_output_shapes_are_written_in_the_users_dimension_names() -> None:
    """An output whose size is an expression of dynamic sizes is written in their names: ``head + tail``."""

    class Joined(nn.Module):
        def forward(self, head: torch.Tensor, tail: torch.Tensor) -> torch.Tensor:
            return torch.cat([head, tail], dim=1)

    module = pipeline.convert(
        Joined(),
        (torch.randn(2, 3), torch.randn(2, 5)),
        dynamic={"head": {1: ("head_len", 2, 4, 8)}, "tail": {1: ("tail_len", 2, 4, 8)}},
        validation_inputs=0,
    )
    batch, joined = module.io.outputs[0].shape
    assert batch == 2 and sorted(str(joined).split(" + ")) == ["head_len", "tail_len"], joined
    assert module(torch.randn(2, 7), torch.randn(2, 4)).shape == (2, 11)


@pytest.mark.parametrize("batch", [17, 32])
def test_dynamic_batch_outside_the_range_is_an_input_error(
    cnn_dynamic: tuple[CNN, pipeline.ConvertedModule], batch: int
) -> None:
    _, module = cnn_dynamic
    with pytest.raises(pipeline.InputError, match=rf"'x' has size {batch} on axis 0 \('batch'\).*\[1, 16\]"):
        module(fresh(batch, 3, 16, 16, seed=0))


def test_dynamic_batch_and_sequence_for_bert(bert_dynamic: tuple[nn.Module, pipeline.ConvertedModule]) -> None:
    model, module = bert_dynamic
    for name in ("input_ids", "attention_mask", "token_type_ids"):
        assert onnx_input_shape(module, name) == ["batch", "seq"], name
    assert module.io.outputs[0].shape == ("batch", "seq", 32)
    assert_report_passed(module, validation_inputs=6)
    for batch, seq in ((1, 3), (4, 16), (3, 11), (2, 1)):
        inputs = bert_inputs(batch, seq, seed=90 + batch * seq)
        got = module(**inputs)
        want = reference(model, **inputs)
        assert got.last_hidden_state.shape == (batch, seq, 32)
        assert_same_tree(got, want)


def test_bert_inputs_sharing_a_dimension_must_agree(bert_dynamic: tuple[nn.Module, pipeline.ConvertedModule]) -> None:
    _, module = bert_dynamic
    inputs = bert_inputs(2, 8, seed=0)
    inputs["attention_mask"] = torch.ones(2, 9, dtype=torch.long)
    with pytest.raises(pipeline.InputError, match=r"'seq'.*'input_ids'.*'attention_mask'"):
        module(**inputs)
    with pytest.raises(pipeline.InputError, match=r"'input_ids' has size 17 on axis 1 \('seq'\).*\[1, 16\]"):
        module(**bert_inputs(2, 17, seed=0))


# -- 8. transformers ResNet, ViT and BERT to 1e-4 relative ------------------------------------------------------------

Case = tuple[nn.Module, pipeline.ConvertedModule, Callable[[int], dict[str, torch.Tensor]]]


@pytest.fixture(scope="module")
def hf_resnet() -> Case:
    model = hf_resnet_model()
    module = convert(model, {"pixel_values": torch.randn(2, 3, 32, 32)})
    return model, module, lambda seed: {"pixel_values": fresh(2, 3, 32, 32, seed=seed)}


@pytest.fixture(scope="module")
def hf_vit() -> Case:
    model = hf_vit_model()
    module = convert(model, {"pixel_values": torch.randn(2, 3, 16, 16)})
    return model, module, lambda seed: {"pixel_values": fresh(2, 3, 16, 16, seed=seed)}


@pytest.fixture(scope="module")
def hf_bert_mlm() -> Case:
    torch.manual_seed(0)
    model = transformers.BertForMaskedLM(tiny_bert_config()).eval()
    module = convert(model, bert_inputs(2, 8, seed=2, lengths=[8, 4]))
    return model, module, lambda seed: bert_inputs(2, 8, seed=seed, lengths=[6, 8])


@pytest.mark.parametrize("case", ["hf_resnet", "hf_vit", "hf_bert_mlm"])
def test_transformers_models_match_to_1e_4_relative(case: str, request: pytest.FixtureRequest) -> None:
    model, module, make_inputs = request.getfixturevalue(case)
    assert_report_passed(module)
    for o in module.report.accuracy.outputs:
        assert o.rtol == 1e-4, o
    for seed in (101, 102):
        inputs = make_inputs(seed)
        got = module(**inputs)
        want = reference(model, **inputs)
        assert type(got) is type(want)
        assert list(got.keys()) == list(want.keys())
        for key in want:
            torch.testing.assert_close(got[key], want[key], rtol=1e-4, atol=1e-5, msg=lambda m, k=key: f"{k}: {m}")


# -- 9. calling conventions --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gated() -> tuple[Gated, pipeline.ConvertedModule]:
    torch.manual_seed(0)
    model = Gated().eval()
    sample = ((torch.randn(3, 4),), {"mask": torch.rand(3, 4), "bias": torch.randn(4)})
    return model, convert(model, sample)


def test_kwargs_in_another_order_or_positional(gated: tuple[Gated, pipeline.ConvertedModule]) -> None:
    model, module = gated
    assert [i.name for i in module.onnx.graph.input] == ["x", "mask", "bias"]
    x, mask, bias = fresh(3, 4, seed=111), fresh(3, 4, seed=112).sigmoid(), fresh(4, seed=113)
    want = reference(model, x, mask=mask, bias=bias)
    calls = {
        "as sampled": lambda: module(x, mask=mask, bias=bias),
        "kwargs reordered": lambda: module(x, bias=bias, mask=mask),
        "all positional": lambda: module(x, mask, bias),
        "all keywords": lambda: module(bias=bias, x=x, mask=mask),
        "mixed": lambda: module(x, mask, bias=bias),
    }
    for how, call in calls.items():
        got = call()
        torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL, msg=lambda m, h=how: f"{h}: {m}")


def test_bert_kwargs_reordered_or_positional(bert: tuple[nn.Module, pipeline.ConvertedModule]) -> None:
    model, module = bert
    inputs = bert_inputs(2, 8, seed=121, lengths=[7, 2])
    want = reference(model, **inputs)
    ids, mask, types = inputs["input_ids"], inputs["attention_mask"], inputs["token_type_ids"]
    assert_same_tree(module(token_type_ids=types, input_ids=ids, attention_mask=mask), want)
    assert_same_tree(module(ids, mask, types), want)
    assert_same_tree(module(ids, attention_mask=mask, token_type_ids=types), want)


def test_keyword_only_argument() -> None:
    torch.manual_seed(0)
    model = KeywordOnly().eval()
    module = convert(model, ((torch.randn(2, 4),), {"scale": torch.rand(4)}))
    assert_builds(module)
    x, scale = fresh(2, 4, seed=131), fresh(4, seed=132)
    torch.testing.assert_close(module(x, scale=scale), reference(model, x, scale=scale), rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(module(scale=scale, x=x), reference(model, x, scale=scale), rtol=RTOL, atol=ATOL)
    with pytest.raises(pipeline.InputError, match="do not fit"):
        module(x, scale)  # the signature does not allow it, exactly as for the original model
    with pytest.raises(TypeError):
        model(x, scale)


# -- dynamic BERT from a padded sample ---------------------------------------------------------------------------


def test_dynamic_bert_converts_from_a_padded_sample() -> None:
    # The sample is a padded tokenizer batch, as users have it; conversion must succeed and match PyTorch.
    # Validation keeps the mask's pattern: a random {0, 1} mask gives fully padded rows at the dynamic minimum,
    # where PyTorch's SDPA returns zeros and the exported graph uniform attention (as BERT's eager attention
    # does), and convert would fail although every realistic input matches.
    torch.manual_seed(1)
    model = transformers.BertModel(tiny_bert_config()).eval()
    module = convert(model, bert_inputs(2, 8, seed=1, lengths=[8, 6]), dynamic=BERT_DYNAMIC)
    assert_report_passed(module, validation_inputs=6)
    assert_builds(module)  # the real TensorRT-RTX builder builds the final graph
    for batch, seq in ((1, 5), (3, 12)):
        inputs = bert_inputs(batch, seq, seed=95 + seq)
        assert_same_tree(module(**inputs), reference(model, **inputs))


# -- the real builder --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "case",
    [
        "mlp",
        "cnn",
        "cnn_dynamic",
        "bert",
        "bert_dynamic",
        "two_in_two_out",
        "gated",
        "hf_resnet",
        "hf_vit",
        "hf_bert_mlm",
    ],
)
def test_final_fp32_graph_builds_with_tensorrt_rtx(case: str, request: pytest.FixtureRequest) -> None:
    """module.onnx, dynamic dims and all, is what the real TensorRT-RTX builder builds (fp16 and bf16 graphs of the
    same models: tests/pipeline/test_rtx_builds.py)."""
    module = request.getfixturevalue(case)[1]
    assert_builds(module)
