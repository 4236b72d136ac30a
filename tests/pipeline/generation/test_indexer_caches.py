"""The keys an indexed attention layer's cache holds beside its keys and values, found as what they are (a floating
tensor over the keys' tokens, written by an ``update*`` method the layer's class adds to transformers' layers), not
by one model's names: DeepSeek sparse attention's ``indexer_keys`` [batch, tokens, width] by ``update_indexer``,
MiniMax-M3's block indexer's [batch, 1, tokens, width] by ``update_index``. The step's cache layer answers to the
model's own names, in the form the model hands them. A cache layer keeping tensors the step would not carry is refused
by name, and so is MiniMax-M3's ``block_indices`` (the key blocks its attention may see, which its code expands into
a mask only for eager and SDPA attention): the step does not drop them."""

from __future__ import annotations

import pytest
import torch
import transformers
from transformers.cache_utils import DynamicIndexedLayer, DynamicLayer
from transformers.models.minimax_m3_vl import modeling_minimax_m3_vl as minimax

import pipeline
from converters.errors import InputError
from pipeline.generation.model_cache import indexer_keys
from pipeline.generation.step import StepIndexedLayer


def written(layer: DynamicLayer, tokens: int = 5) -> DynamicLayer:
    """``layer`` after one update of ``tokens`` keys and values [1, 2, tokens, 4]."""
    layer.update(torch.randn(1, 2, tokens, 4), torch.randn(1, 2, tokens, 4))
    return layer


def test_deepseek_and_minimax_indexer_caches_are_found_with_their_writers() -> None:
    deepseek = written(DynamicIndexedLayer())
    deepseek.update_indexer(torch.randn(1, 5, 16))
    tensor, writes = indexer_keys(deepseek, deepseek.keys, "layer 0")
    assert tensor is not None and tuple(tensor.shape) == (1, 5, 16) and writes == ("update_indexer",)

    block = written(minimax.MiniMaxM3VLSparseCacheLayer())
    block.update_index(torch.randn(1, 1, 5, 8))
    tensor, writes = indexer_keys(block, block.keys, "layer 0")
    assert tensor is not None and tuple(tensor.shape) == (1, 1, 5, 8) and writes == ("update_index",)

    plain = written(DynamicLayer())
    assert indexer_keys(plain, plain.keys, "layer 0") == (None, ())


def test_a_cache_layer_keeping_more_than_the_step_carries_is_refused_by_name() -> None:
    class TwoExtras(DynamicIndexedLayer):
        """An indexer cache and a second floating tensor the step would not carry."""

        def update_scales(self, scales: torch.Tensor) -> None:
            self.scales = scales

    layer = written(TwoExtras())
    layer.update_indexer(torch.randn(1, 5, 16))
    layer.update_scales(torch.randn(1, 5))
    with pytest.raises(InputError, match=r"keeps indexer_keys, scales beside its keys and values"):
        indexer_keys(layer, layer.keys, "cache layer 3 of TwoExtras")

    wide = written(DynamicIndexedLayer())
    wide.update_indexer(torch.randn(1, 7, 16))  # not over the keys' 5 tokens
    with pytest.raises(InputError, match=r"holds indexer_keys \(1, 7, 16\)"):
        indexer_keys(wide, wide.keys, "cache layer 0")


def test_the_step_layer_answers_the_models_writer_in_its_form() -> None:
    past = torch.tensor(2)
    keys, values = torch.zeros(1, 2, 6, 4), torch.zeros(1, 2, 6, 4)
    layer = StepIndexedLayer(keys, values, torch.zeros(1, 1, 6, 8), past, None, ("update_index",))
    new = torch.randn(1, 1, 3, 8)
    whole = layer.update_index(new)  # type: ignore[attr-defined]
    assert tuple(whole.shape) == (1, 1, 6, 8) and torch.equal(whole[:, :, 2:5], new) and not whole[:, :, :2].any()
    flat = layer.update_indexer(torch.ones(1, 1, 8))
    assert tuple(flat.shape) == (1, 6, 8) and torch.equal(flat[0, 2], torch.ones(8))


def test_minimax_block_sparse_attention_is_refused_by_name_not_dropped() -> None:
    """A MiniMax-M3 text model with a block-sparse layer whose blocks (4 keys, top 2) are fewer than its prompt's:
    the selection would change the logits; the conversion says what it does not compute."""
    config = minimax.MiniMaxM3VLTextConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=32,
        dense_intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        num_local_experts=2,
        num_experts_per_tok=1,
        layer_types=["minimax_m3_sparse", "full_attention"],
        mlp_layer_types=["dense", "dense"],
        index_n_heads=1,
        index_head_dim=8,
        index_block_size=4,
        index_topk_blocks=2,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    model = transformers.MiniMaxM3VLForCausalLM(config).eval()
    ids = torch.randint(3, 64, (2, 12))
    with pytest.raises(InputError, match=r"block_indices") as refused:
        pipeline.convert(model, {"input_ids": ids}, generation={"max_length": 24, "max_batch": 2})
    assert "MiniMaxM3VLAttention hands its attention function (it would drop them)" in str(refused.value)
