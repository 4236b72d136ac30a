"""A half-precision encoder-decoder whose greedy tokens part from float32 PyTorch's at a near tie converts: its steps
are judged fed PyTorch's tokens and the report says where the tokens part (Pop2Piano in fp16 was refused so: its
second row's first token is 0.0007 in log-probability from the next, and PyTorch's own float16 parts there too).
The tie is made exact in float16 and not in float32: a tiny BART whose two tokens have one embedding (tied to the
output matrix) and final logit biases 2e-4 apart, which float16 rounds away at logits near 5 (one unit in the last
place: 0.004), so the lower id wins the argmax. A departure beyond the accuracy policy is still an AccuracyError."""

from __future__ import annotations

import pytest
import torch
import transformers
from tiny_models import lively

import pipeline
from converters.errors import AccuracyError
from pipeline.generation.generate_scores import GROSS, departed, judged_departure
from pipeline.runtime.reports.accuracy import DecodingAccuracy, StepAccuracy

GREEDY = {"max_new_tokens": 8, "do_sample": False, "num_beams": 1}


def source() -> dict[str, torch.Tensor]:
    ids = torch.randint(4, 96, (2, 7), generator=torch.Generator().manual_seed(5))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    return {"input_ids": ids.masked_fill(mask == 0, 1), "attention_mask": mask}


def tied_bart(inputs: dict[str, torch.Tensor]) -> tuple[torch.nn.Module, int, int]:
    """The BART, float32's first new token on the second row (``chosen``), and the lowest ordinary id (``tied``, below
    it) given its output row and a final logit bias 2e-4 below its."""
    layers = {"encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4, "decoder_attention_heads": 4}
    sizes = {"vocab_size": 96, "d_model": 32, "encoder_ffn_dim": 48, "decoder_ffn_dim": 48}
    config = transformers.BartConfig(**layers, **sizes, max_position_embeddings=64)
    model = lively(lambda: transformers.BartForConditionalGeneration(config), seed=3, std=0.25)
    with torch.no_grad():
        model.final_logits_bias.zero_()
        chosen = int(model.generate(**inputs, **GREEDY)[1, 1])
        tied = 4  # below every id but the special ones (0-3)
        assert chosen > tied
        model.get_output_embeddings().weight[tied] = model.get_output_embeddings().weight[chosen]
        model.final_logits_bias[0, chosen] = 2e-4
    return model, chosen, tied


def test_a_near_tie_in_float16_converts_and_the_report_says_where_it_parts() -> None:
    inputs = source()
    model, chosen, tied = tied_bart(inputs)
    with torch.no_grad():
        expected = model.generate(**inputs, **GREEDY)
    assert expected[1, 1] == chosen
    module = pipeline.convert(model, inputs, generation={"max_length": 24, "max_batch": 4}, precision="fp16")
    ours = module.generate(**inputs, **GREEDY)
    assert torch.equal(ours[0], expected[0]) and ours[1, 1] == tied  # the tie goes to the lower id
    decoding = module.decoder.report.accuracy.decoding
    assert decoding.first_divergence == 0 and decoding.greedy < decoding.greedy_tokens
    assert all(step.passed for step in decoding.per_step)  # fed PyTorch's tokens, every step within the policy
    assert "a near tie in the low precision" in decoding.note and "are identical" not in decoding.note


def decoding(max_abs: float) -> DecodingAccuracy:
    step = StepAccuracy(step=3, max_abs=max_abs, max_rel=0.0, relative_rms=0.0, atol_used=0.01, outside=1,
                        elements=10, passed=max_abs <= 0.01)  # fmt: skip
    return DecodingAccuracy(prompts=("p",), steps=4, computed_in="float16", tolerance={}, per_step=(step,),
                            greedy=8, greedy_tokens=8, precision="fp16")  # fmt: skip


def test_tokens_that_part_in_float32_or_beyond_the_policy_are_refused() -> None:
    model = torch.nn.Identity()
    wanted, chosen = torch.tensor([[2, 5, 6]]), torch.tensor([[2, 5, 7]])
    assert not departed(model, "the module", wanted, wanted.clone(), "fp32")
    with pytest.raises(AccuracyError, match=r"the module's greedy tokens differ from Identity.generate"):
        departed(model, "the module", wanted, chosen, "fp32")
    assert departed(model, "the module", wanted, chosen, "fp16")
    near = judged_departure(decoding(0.05), model, "the module", wanted, chosen, 1, "fp16")
    assert near is not None and near.first_divergence == 1 and near.greedy == 1
    with pytest.raises(AccuracyError, match=rf"more than {GROSS:g}x beyond the accuracy policy \(step 3: 0.2\)"):
        judged_departure(decoding(0.2), model, "the module", wanted, chosen, 1, "fp16")
