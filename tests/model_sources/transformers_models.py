"""transformers: architectures built from programmatically shrunk configs (random weights, no hub).

:func:`shrunk_config` takes the architecture's config class with its defaults and overrides every size it has
(:data:`SMALL`: width 32, 2 layers, 2 heads, 4 experts, 32x32 images, ...), in its sub-configs too (a CLIP's text
and vision configs); :data:`ARCHITECTURES` adds what one architecture needs beyond that. The model is the
architecture's base class (``AutoModel.from_config``) and the sample what its ``forward`` takes, by input kind.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from model_sources import ModelCase, image, seeded, token_ids

SMALL: dict[str, Any] = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "intermediate_size": 64,
    "head_dim": 16,
    "vocab_size": 128,
    "max_position_embeddings": 64,
    "d_model": 32,
    "d_ff": 64,
    "d_kv": 16,
    "num_layers": 2,
    "num_heads": 2,
    "num_decoder_layers": 2,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_attention_heads": 2,
    "decoder_attention_heads": 2,
    "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
    "n_embd": 32,
    "n_layer": 2,
    "n_head": 2,
    "n_inner": 64,
    "n_positions": 64,
    "n_ctx": 64,
    "num_experts": 4,
    "num_local_experts": 4,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
    "projection_dim": 32,
    "image_size": 32,
    "patch_size": 8,
    "embedding_size": 32,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "decoder_start_token_id": 1,
    "use_cache": False,
    "max_source_positions": 16,
    "max_target_positions": 64,
    "num_mel_bins": 16,
}
TEXT, SEQ2SEQ, VISION, PATCHES, TEXT_IMAGE, AUDIO, WHISPER, SPECTROGRAM = (
    "text",
    "seq2seq",
    "vision",
    "patches",
    "text+image",
    "audio",
    "whisper",
    "spectrogram",
)
# seq2seq with the encoder's attention mask, as a tokenizer returns it: LongT5 and Switch Transformers make their
# default mask only when they run eagerly (`not is_torchdynamo_compiling()`), so without one torch.export fails
SEQ2SEQ_MASKED = "seq2seq+mask"

# model_type: (family, input kind, overrides beyond SMALL)
ARCHITECTURES: dict[str, tuple[str, str, dict[str, Any]]] = {
    # encoders
    "bert": ("encoder", TEXT, {}),
    "roberta": ("encoder", TEXT, {}),
    "distilbert": ("encoder", TEXT, {"dim": 32, "n_layers": 2, "hidden_dim": 64, "n_heads": 2}),
    "albert": ("encoder", TEXT, {}),
    "electra": ("encoder", TEXT, {}),
    "deberta": ("encoder", TEXT, {}),
    "deberta-v2": ("encoder", TEXT, {}),
    "xlm-roberta": ("encoder", TEXT, {}),
    "mpnet": ("encoder", TEXT, {}),
    "convbert": ("encoder", TEXT, {}),
    "ernie": ("encoder", TEXT, {}),
    "modernbert": ("encoder", TEXT, {"global_attn_every_n_layers": 2, "local_attention": 4}),
    "megatron-bert": ("encoder", TEXT, {}),
    "roformer": ("encoder", TEXT, {}),
    "squeezebert": ("encoder", TEXT, {}),
    "mobilebert": ("encoder", TEXT, {"intra_bottleneck_size": 32}),
    "esm": ("encoder", TEXT, {}),
    "rembert": ("encoder", TEXT, {"input_embedding_size": 32, "output_embedding_size": 32}),
    "data2vec-text": ("encoder", TEXT, {}),
    "nystromformer": ("encoder", TEXT, {"num_landmarks": 4, "segment_means_seq_len": 8}),
    "ibert": ("encoder", TEXT, {}),
    "fnet": ("encoder", TEXT, {}),
    "big_bird": ("encoder", TEXT, {"attention_type": "original_full"}),
    "longformer": ("encoder", TEXT, {"attention_window": 4}),
    # decoders
    "gpt2": ("decoder", TEXT, {}),
    "gpt_neo": ("decoder", TEXT, {"attention_types": [[["global", "local"], 1]], "window_size": 4}),
    "gpt_neox": ("decoder", TEXT, {}),
    "gptj": ("decoder", TEXT, {"rotary_dim": 8}),
    "opt": ("decoder", TEXT, {"ffn_dim": 64, "word_embed_proj_dim": 32}),
    "bloom": ("decoder", TEXT, {}),
    "llama": ("decoder", TEXT, {}),
    "mistral": ("decoder", TEXT, {}),
    "qwen2": ("decoder", TEXT, {}),
    "qwen3": ("decoder", TEXT, {}),
    "phi": ("decoder", TEXT, {}),
    "phi3": ("decoder", TEXT, {}),
    "gemma": ("decoder", TEXT, {}),
    "gemma2": ("decoder", TEXT, {}),
    "gemma3_text": ("decoder", TEXT, {}),
    "falcon": ("decoder", TEXT, {}),
    "stablelm": ("decoder", TEXT, {}),
    "starcoder2": ("decoder", TEXT, {}),
    "olmo": ("decoder", TEXT, {}),
    "olmo2": ("decoder", TEXT, {}),
    "cohere": ("decoder", TEXT, {}),
    "granite": ("decoder", TEXT, {}),
    "codegen": ("decoder", TEXT, {"rotary_dim": 8}),
    "biogpt": ("decoder", TEXT, {}),
    "xglm": ("decoder", TEXT, {"ffn_dim": 64}),
    "mpt": ("decoder", TEXT, {}),
    "persimmon": ("decoder", TEXT, {}),
    "helium": ("decoder", TEXT, {}),
    "glm": ("decoder", TEXT, {}),
    "smollm3": ("decoder", TEXT, {}),
    "gpt_bigcode": ("decoder", TEXT, {}),
    # mixtures of experts
    "mixtral": ("moe", TEXT, {}),
    "qwen2_moe": ("moe", TEXT, {}),
    "qwen3_moe": ("moe", TEXT, {}),
    "olmoe": ("moe", TEXT, {}),
    "granitemoe": ("moe", TEXT, {}),
    "phimoe": ("moe", TEXT, {}),
    "jetmoe": ("moe", TEXT, {"kv_channels": 16}),
    "gpt_oss": ("moe", TEXT, {}),
    # multi-head latent attention expands its keys and values to every query head itself: a real checkpoint has
    # as many key/value heads as query heads (128 and 128), and SMALL's 1 would make transformers' SDPA repeat the
    # already expanded heads (2 -> 4), which eager PyTorch only escapes while no attention mask is materialised;
    # head sizes in DeepSeek-V3's proportions (nope 128, rope 64, value 128)
    "deepseek_v3": (
        "moe",
        TEXT,
        {
            "num_key_value_heads": 2,
            "kv_lora_rank": 16,
            "q_lora_rank": 16,
            "qk_rope_head_dim": 8,
            "qk_nope_head_dim": 16,
            "v_head_dim": 16,
            "n_group": 1,
            "topk_group": 1,
            "first_k_dense_replace": 1,
            "n_shared_experts": 1,
        },
    ),
    # one key/value head per query head, as in every LongCat-Flash checkpoint (its MLA attention expands them itself)
    "longcat_flash": (
        "moe",
        TEXT,
        {
            "expert_ffn_hidden_size": 32,
            "zero_expert_num": 2,
            "moe_topk": 2,
            "kv_lora_rank": 16,
            "q_lora_rank": 16,
            "qk_rope_head_dim": 8,
            "qk_nope_head_dim": 8,
            "v_head_dim": 16,
            "ffn_hidden_size": 64,
            "head_dim": 8,
            "num_key_value_heads": 2,
        },
    ),
    # state-space and recurrent
    "mamba": ("state-space", TEXT, {"state_size": 8, "expand": 2}),
    "mamba2": ("state-space", TEXT, {"state_size": 8, "expand": 2, "n_groups": 1, "chunk_size": 8, "num_heads": 4}),
    "falcon_mamba": ("state-space", TEXT, {"state_size": 8}),
    "rwkv": ("state-space", TEXT, {"attention_hidden_size": 32}),
    "jamba": (
        "state-space",
        TEXT,
        {
            "mamba_d_state": 8,
            "attn_layer_period": 2,
            "attn_layer_offset": 1,
            "expert_layer_period": 2,
            "expert_layer_offset": 1,
        },
    ),
    "recurrent_gemma": ("state-space", TEXT, {"lru_width": 32, "block_types": ["recurrent", "attention"]}),
    # encoder-decoders
    "t5": ("encoder-decoder", SEQ2SEQ, {}),
    "bart": ("encoder-decoder", SEQ2SEQ, {}),
    "mbart": ("encoder-decoder", SEQ2SEQ, {}),
    "pegasus": ("encoder-decoder", SEQ2SEQ, {}),
    "marian": ("encoder-decoder", SEQ2SEQ, {"decoder_vocab_size": 128}),
    "blenderbot": ("encoder-decoder", SEQ2SEQ, {}),
    "mt5": ("encoder-decoder", SEQ2SEQ, {}),
    "m2m_100": ("encoder-decoder", SEQ2SEQ, {}),
    "umt5": ("encoder-decoder", SEQ2SEQ, {}),
    "switch_transformers": ("moe", SEQ2SEQ_MASKED, {"num_sparse_encoder_layers": 1, "num_sparse_decoder_layers": 1}),
    "nllb-moe": ("moe", SEQ2SEQ, {"expert_capacity": 16, "encoder_sparse_step": 2, "decoder_sparse_step": 2}),
    "longt5": ("encoder-decoder", SEQ2SEQ_MASKED, {}),
    "plbart": ("encoder-decoder", SEQ2SEQ, {}),
    # vision
    "vit": ("vision", VISION, {}),
    "deit": ("vision", VISION, {}),
    "beit": ("vision", VISION, {}),
    "swin": (
        "vision",
        VISION,
        {"embed_dim": 16, "depths": [1, 1], "num_heads": [2, 2], "window_size": 2, "patch_size": 4},
    ),
    "swinv2": (
        "vision",
        VISION,
        {"embed_dim": 16, "depths": [1, 1], "num_heads": [2, 2], "window_size": 2, "patch_size": 4},
    ),
    "convnext": ("vision", VISION, {"hidden_sizes": [8, 16, 32, 64], "depths": [1, 1, 1, 1], "image_size": 64}),
    "convnextv2": ("vision", VISION, {"hidden_sizes": [8, 16, 32, 64], "depths": [1, 1, 1, 1], "image_size": 64}),
    "resnet": ("vision", VISION, {"hidden_sizes": [16, 32, 64, 128], "depths": [1, 1, 1, 1]}),
    "regnet": ("vision", VISION, {}),
    "efficientnet": ("vision", VISION, {"image_size": 64}),
    "mobilenet_v2": ("vision", VISION, {}),
    "mobilenet_v1": ("vision", VISION, {}),
    "mobilevit": ("vision", VISION, {"image_size": 64}),
    "levit": ("vision", VISION, {"image_size": 64, "patch_size": 16}),
    "poolformer": ("vision", VISION, {}),
    "segformer": ("vision", VISION, {}),
    "dinov2": ("vision", VISION, {}),
    "pvt": ("vision", VISION, {}),
    "cvt": ("vision", VISION, {}),
    "bit": ("vision", VISION, {}),
    "focalnet": ("vision", VISION, {"embed_dim": 16, "depths": [1, 1], "patch_size": 4}),
    "hiera": ("vision", VISION, {"image_size": [64, 64], "patch_size": [7, 7]}),
    "glpn": ("vision", VISION, {}),
    "data2vec-vision": ("vision", VISION, {}),
    "yolos": ("vision", VISION, {"image_size": [32, 32], "num_detection_tokens": 4}),
    "gemma4_vision": ("vision", PATCHES, {"pooling_kernel_size": 2}),
    # audio
    "wav2vec2": ("audio", AUDIO, {}),
    "hubert": ("audio", AUDIO, {}),
    "wavlm": ("audio", AUDIO, {}),
    "data2vec-audio": ("audio", AUDIO, {}),
    "sew": ("audio", AUDIO, {}),
    "unispeech": ("audio", AUDIO, {}),
    "whisper": ("audio", WHISPER, {}),
    "audio-spectrogram-transformer": ("audio", SPECTROGRAM, {"max_length": 32, "patch_size": 16}),
    # multimodal
    "clip": ("multimodal", TEXT_IMAGE, {}),
    "siglip": ("multimodal", TEXT_IMAGE, {}),
    "chinese_clip": ("multimodal", TEXT_IMAGE, {}),
    "altclip": ("multimodal", TEXT_IMAGE, {}),
    "owlvit": ("multimodal", TEXT_IMAGE, {}),
}


def _transformers() -> Any:
    import tests_environment  # noqa: F401 -- torchvision's operator schemas: transformers' image models import it
    import transformers

    return transformers


def _fitting(cls: type, values: dict[str, Any]) -> dict[str, Any]:
    """The entries of ``values`` that ``cls``'s constructor takes, sub-configs shrunk recursively."""
    parameters = inspect.signature(cls.__init__).parameters
    # a per-stage list (depths, heads per stage) keeps its default: a scalar would not fit it
    kwargs = {k: v for k, v in values.items() if k in parameters and not _is_list(parameters[k].default, v)}
    for name, sub in (getattr(cls, "sub_configs", None) or {}).items():
        if name in parameters and isinstance(sub, type) and sub.__name__ != "AutoConfig":
            kwargs[name] = _fitting(sub, values)
    return kwargs


def _is_list(default: Any, value: Any) -> bool:
    return isinstance(default, (list, tuple)) and not isinstance(value, (list, tuple))


def shrunk_config(model_type: str, overrides: dict[str, Any] | None = None) -> Any:
    """``model_type``'s config with every size in :data:`SMALL` it has (and ``overrides``) applied."""
    cls = _transformers().CONFIG_MAPPING[model_type]
    return cls(**_fitting(cls, SMALL | (overrides or {})))


def _image_size(config: Any) -> int:
    vision = getattr(config, "vision_config", None) or config
    size = getattr(vision, "image_size", 32)
    return int(size[0] if isinstance(size, (list, tuple)) else size)


def sample_for(kind: str, config: Any) -> Any:
    """The ``(args, kwargs)`` sample of an input kind."""
    if kind == TEXT:
        return (), {"input_ids": token_ids()}
    if kind == SEQ2SEQ:
        return (), {"input_ids": token_ids(), "decoder_input_ids": token_ids(4)}
    if kind == SEQ2SEQ_MASKED:
        ids = token_ids()
        return (), {"input_ids": ids, "attention_mask": torch.ones_like(ids), "decoder_input_ids": token_ids(4)}
    if kind == VISION:
        return (), {"pixel_values": image(_image_size(config), getattr(config, "num_channels", 3))}
    if kind == PATCHES:  # patchified pixels (batch, patches, 3 * patch**2) and each patch's (x, y) position
        side = _image_size(config) // config.patch_size
        positions = torch.stack(torch.meshgrid(torch.arange(side), torch.arange(side), indexing="xy"), -1)
        patches = torch.rand(1, side * side, 3 * config.patch_size**2, generator=seeded())
        return (), {"pixel_values": patches, "pixel_position_ids": positions.reshape(1, side * side, 2)}
    if kind == TEXT_IMAGE:
        return (), {"input_ids": token_ids(), "pixel_values": image(_image_size(config))}
    if kind == AUDIO:
        return (), {"input_values": torch.randn(1, 1600, generator=seeded())}
    if kind == WHISPER:
        frames = 2 * config.max_source_positions
        features = torch.randn(1, config.num_mel_bins, frames, generator=seeded())
        return (), {"input_features": features, "decoder_input_ids": token_ids(4)}
    if kind == SPECTROGRAM:
        return (), {"input_values": torch.randn(1, config.max_length, config.num_mel_bins, generator=seeded())}
    raise ValueError(f"unknown input kind {kind!r}")


def build(model_type: str) -> tuple[torch.nn.Module, Any]:
    """The architecture's base model (random weights) and its sample."""
    _family, kind, overrides = ARCHITECTURES[model_type]
    config = shrunk_config(model_type, overrides)
    torch.manual_seed(0)
    model = _transformers().AutoModel.from_config(config).eval()
    return model, sample_for(kind, config)


def cases() -> list[ModelCase]:
    """One case per architecture of :data:`ARCHITECTURES`."""
    return [
        ModelCase("transformers", name, family, lambda n=name: build(n))
        for name, (family, _kind, _o) in ARCHITECTURES.items()
    ]
