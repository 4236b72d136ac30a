"""The every-type transformers source (``tests/model_sources/transformers_all_models.py``): it enumerates what
transformers names, not a list, and its generic shrinker and sample search give models that run."""

from __future__ import annotations

import collections

import pytest
import torch
from model_sources import transformers_all_models as every

VLM = ("input_ids", "attention_mask", "pixel_values")
FAMILIES = {"encoder", "decoder", "encoder-decoder", "vision", "audio", "multimodal", "moe", "state-space", "other"}


@pytest.fixture(scope="module")
def cases() -> dict[str, every.ModelCase]:
    return {case.name: case for case in every.cases()}


def test_every_model_type_of_transformers_is_a_case_with_a_family(cases: dict[str, every.ModelCase]) -> None:
    types = every.model_types()
    assert len(types) > 800  # transformers 5.24 names 822
    assert {name.split(":")[0] for name in cases} == set(types)
    assert set(every.families()) == set(types), "write the families again: python -m ...transformers_all_models"
    assert {case.family for case in cases.values()} <= FAMILIES
    heads = collections.Counter(name.split(":")[1] for name in cases if ":" in name)
    assert heads["causal-lm"] > 100 and heads["seq2seq-lm"] > 20 and heads["image-classification"] > 40
    # an encoder-decoder's deployed head is its seq2seq one, though BART and Whisper have a causal LM too
    assert "bart:seq2seq-lm" in cases and "whisper:speech-seq2seq" in cases and "bart:causal-lm" not in cases


@pytest.mark.parametrize(
    ("name", "inputs"),
    [
        ("bert", {"input_ids", "attention_mask"}),
        ("llava:image-text-to-text", {"input_ids", "attention_mask", "pixel_values"}),
        ("gemma3:image-text-to-text", {"input_ids", "attention_mask", "pixel_values"}),
        ("llava_next:image-text-to-text", {"input_ids", "attention_mask", "pixel_values", "image_sizes"}),
        (
            "video_llama_3:image-text-to-text",
            {"input_ids", "attention_mask", "pixel_values", "image_grid_thw", "image_merge_sizes"},
        ),
        ("whisper:speech-seq2seq", {"input_features", "decoder_input_ids"}),
        # token ids the forward requires beside input_ids: the Q-Former's instruction, with its mask;
        # InstructBLIP-Video's frames [1, frames, C, H, W] placed at its video token (it names no image token)
        ("instructblip:image-text-to-text", {*VLM, "qformer_input_ids", "qformer_attention_mask"}),
        ("instructblipvideo:image-text-to-text", {*VLM, "qformer_input_ids", "qformer_attention_mask"}),
        ("donut-swin:image-classification", {"pixel_values"}),
    ],
)
def test_the_sample_is_found_from_the_forward_and_the_model_runs_on_it(
    cases: dict[str, every.ModelCase], name: str, inputs: set[str]
) -> None:
    """The first candidate the model runs on: LLaVA's prompt holds one placeholder token per image feature (the
    model checks the count); LLaVA-NeXT's image is a base tile and one tile of the small tower's size
    [1, 2, C, H, W]; Video-LLaMA 3's merge per image goes with its grid; Donut-Swin needs its config's own image size
    (its 7x7 windows), which a shrink variant keeps."""
    model, (args, kwargs) = cases[name].build()
    assert args == () and set(kwargs) == inputs
    with torch.no_grad():
        model(**kwargs)
    if name.startswith("llava"):
        placeholder = model.config.image_token_id
        assert placeholder < model.config.text_config.vocab_size <= 256  # the text model shrunk too
        assert int((kwargs["input_ids"] == placeholder).sum()) > 1
    if name.startswith("gemma3"):  # 256 tokens per image pooled from a 4x4 grid had a pooling kernel of 0
        grid = model.config.vision_config.image_size // model.config.vision_config.patch_size
        assert int((kwargs["input_ids"] == model.config.image_token_id).sum()) == model.config.mm_tokens_per_image
        assert grid % round(model.config.mm_tokens_per_image**0.5) == 0
    if name.startswith("llava_next"):
        assert kwargs["pixel_values"].dim() == 5 and kwargs["image_sizes"].tolist() == [[32, 32]]
    if name.startswith("donut-swin"):
        assert kwargs["pixel_values"].shape[-1] == model.config.image_size == 224


def test_weights_initialised_constant_are_drawn_again_so_routers_do_not_pick_among_ties() -> None:
    """AFMoE initialises its router's gate to zeros: every expert scores alike, and PyTorch's top-k and ONNX's TopK
    break the ties differently (all 1,024 outputs were off). The source draws such weights again, as a checkpoint's."""
    model, (_, kwargs) = every.build("afmoe", "AfmoeModel")
    constant = [
        name
        for name, parameter in model.named_parameters()
        if parameter.dim() >= 2 and bool((parameter == parameter.reshape(-1)[0]).all())
    ]
    assert constant == []
    moe = next(module for module in model.modules() if type(module).__name__ == "AfmoeSparseMoeBlock")
    hidden = torch.randn(1, 16, model.config.hidden_size, generator=torch.Generator().manual_seed(1))
    _, _, experts = moe.router(hidden, moe.expert_bias)
    assert len({tuple(sorted(row.tolist())) for row in experts}) > 1  # tokens are routed, not tied
    assert every.redraw_constant_matrices(model, 0.02) == []  # nothing constant is left to draw


def test_a_shrink_whose_keys_are_not_grouped_as_its_config_says_gives_way_to_paired_heads() -> None:
    """GLM-4 MoE Lite's latent attention expands keys to every query head: with the small shrink's one key-value head
    for two heads, eager attention ran (one group of one) but transformers' traced path repeated the keys by two and
    torch.export failed on a shape no checkpoint has (its real configs pair them one to one). The source takes the
    next shrink, key-value heads = heads, and the model exports."""
    model, (_, kwargs) = every.build("glm4_moe_lite", "Glm4MoeLiteModel")
    assert model.config.num_key_value_heads == model.config.num_attention_heads
    torch.export.export(model, (), kwargs, strict=False)
    with every.UngroupedKeys() as keys, torch.no_grad():  # the check itself: keys as many as the queries
        query = torch.randn(1, 2, 4, 8)
        torch.nn.functional.scaled_dot_product_attention(query, query, query, enable_gqa=True)
    assert keys.found is not None and "(2, 2, 2)" in keys.found


def test_sizes_a_config_ties_to_another_are_set_from_its_own_check() -> None:
    """Pocket TTS checks that its flow head's ``condition_dim`` (1024) equals the backbone's ``hidden_size``: the
    shrink set one side only. The source reads the pair off the config's own validation error and sets the other
    side, so the type runs instead of being listed as not building."""
    model, (_, kwargs) = every.build("pocket_tts", "PocketTTSModel")
    with torch.no_grad():
        model(**kwargs)
    assert every.tied_size("`codebook_dim` (512) must equal `hidden_size` (32)", {}) == ("codebook_dim", 32)
    assert every.tied_size("`a.hidden_size` (32) must match `b.hidden_size` (1024)", {}) is None  # no one value


def test_the_layers_a_vision_language_model_reads_are_within_its_shrunk_tower() -> None:
    """VipLLaVA reads its tower's layers (-2, -5, -8, -11, 6): shrunk to two layers, they are brought within its three
    hidden states, and the model runs with an image, as many placeholder tokens as its own get_image_features makes."""
    import transformers

    config = every.shrunk("vipllava")
    states = config.vision_config.num_hidden_layers + 1
    assert all(-states <= index < states for index in config.vision_feature_layers)
    model, (_, sample) = every.build("vipllava", "VipLlavaForConditionalGeneration")
    assert "pixel_values" in sample
    with torch.no_grad():
        features = model.model.get_image_features(pixel_values=sample["pixel_values"])
    features = getattr(features, "pooler_output", features)
    tokens = int((sample["input_ids"] == config.image_token_id).sum())
    assert tokens == features.reshape(-1, features.shape[-1]).shape[0]
    assert isinstance(model, transformers.VipLlavaForConditionalGeneration)


@pytest.mark.parametrize(
    ("model_type", "inputs"),
    [
        # the text cross-attends to tiles padded to the config's max_num_tiles, one tile seen
        (
            "mllama",
            {"input_ids", "attention_mask", "pixel_values", "cross_attention_mask", "aspect_ratio_ids"}
            | {"aspect_ratio_mask"},
        ),
        # cross-attention to [1, images, C, H, W], no placeholder tokens
        ("idefics", {"input_ids", "attention_mask", "pixel_values", "image_attention_mask"}),
        # get_image_features requires the image's size in patches; the config leaves image_token_id unset
        ("minicpmv4_6", {"input_ids", "attention_mask", "pixel_values", "target_sizes"}),
        # a NaViT tower (Siglip2's): flattened patches [1, patches, C * p * p], their grid and a mask per patch
        ("lfm2_vl", {"input_ids", "attention_mask", "pixel_values", "spatial_shapes", "pixel_attention_mask"}),
        # get_image_features requires a second image its forward leaves optional; its SAM tower's global layers fitted
        ("deepseek_vl_hybrid", {"input_ids", "attention_mask", "pixel_values", "high_res_pixel_values"}),
        # the base model's get_image_features requires a mask per tile, which the head's leaves optional
        ("granite_docling", {"input_ids", "attention_mask", "pixel_values", "pixel_attention_mask"}),
        # placeholders counted from the model's own count check (its features go to decoder layers)
        ("granite4_vision", {"input_ids", "attention_mask", "pixel_values", "image_sizes"}),
    ],
)
def test_the_image_sample_holds_an_image_the_logits_depend_on(model_type: str, inputs: set[str]) -> None:
    """Types whose image sample the search did not find (they ran on text alone, or on no candidate): the sample
    holds the image in the layout the model's tower takes, with the inputs its forward names for it, and another image
    gives other logits (the image is not ignored: Mllama's and IDEFICS's cross-attention gates, which transformers
    starts closed, are opened)."""
    import transformers

    class_name = transformers.models.auto.modeling_auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES[model_type]
    model, (args, kwargs) = every.build(model_type, class_name)
    assert args == () and set(kwargs) == inputs
    other = {**kwargs, "pixel_values": torch.randn(kwargs["pixel_values"].shape, generator=torch.Generator())}
    with torch.no_grad():
        logits, other_logits = model(**kwargs).logits, model(**other).logits
    assert (logits - other_logits).abs().max() > 1e-3
    if model_type == "minicpmv4_6":  # one placeholder per feature its own get_image_features makes of the image
        features = model.model.get_image_features(kwargs["pixel_values"], kwargs["target_sizes"]).pooler_output
        tokens = int((kwargs["input_ids"] == model.config.image_token_id).sum())
        assert tokens == sum(f.shape[0] for f in features) > 0


def test_a_width_held_by_several_sizes_is_repaired_in_the_config_stating_the_layers_output() -> None:
    """Llama 4's projector is fed 4 x its tower's width (a pixel shuffle); the tower's ``intermediate_size`` and the
    text model's both hold the expected 64, and only the tower's config states the layer's output (4096)."""
    config = every.shrunk("llama4")
    message = "mat1 and mat2 shapes cannot be multiplied (4x128 and 64x4096)"
    assert every.width_repair(config, message) == {("Llama4VisionConfig", "intermediate_size"): 128}


def test_a_token_id_the_code_reads_and_the_config_lacks_is_given_one() -> None:
    """Qwen2.5-Omni's thinker reads ``vision_start_token_id``, which only the whole Omni model's config defines: the
    source gives it a free marker id (read off the AttributeError) and the thinker runs with its image."""
    model, (_, kwargs) = every.build("qwen2_5_omni_thinker", "Qwen2_5OmniThinkerForConditionalGeneration")
    assert {"pixel_values", "image_grid_thw"} <= set(kwargs)
    token = model.config.vision_start_token_id
    assert token < model.config.text_config.vocab_size and token not in kwargs["input_ids"]
    assert every.free_token(model.config, None) != token


def test_generate_caches_so_a_generated_placeholder_is_text() -> None:
    """SMALL's ``use_cache=False`` reached Janus's generation config: generate ran the prompt and its image again at
    every step and failed when it generated the image placeholder (33 placeholder tokens for 32 features). The source
    generates with the cache, as checkpoints do."""
    model, (_, kwargs) = every.build("janus", "JanusForConditionalGeneration")
    assert model.generation_config.use_cache is True and "pixel_values" in kwargs
    with torch.no_grad():
        model.generate(**kwargs, max_new_tokens=4, do_sample=False)


def test_a_linear_attention_is_shrunk_as_the_rest_and_sinkhorn_iterations_are_kept() -> None:
    """GLM-5 Next's Kimi delta attention keeps its own ``linear_num_heads`` and ``linear_head_dim`` (64 heads of 128;
    transformers' reference chunked scan took over a minute for 8 greedy tokens of the small config at those): sizes
    named after the shrunk ``num_heads`` and ``head_dim``, shrunk as those are. Its hyper-connections' 20 Sinkhorn
    iterations (39 chained normalizations) are the checkpoint's: TensorRT-RTX builds them since the default passes
    sum them by MatMuls (``passes.chained_sums``), so the sweep builds what a checkpoint's step is."""
    text = every.shrunk("glm5_next", variant=1).get_text_config()  # its config asks for as many kv heads as heads
    assert (text.linear_num_heads, text.linear_head_dim, text.hc_sinkhorn_iters) == (2, 16, 20)
