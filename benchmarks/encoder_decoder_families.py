"""Which transformers encoder-decoder families generate token-identically after ``convert(..., generation=...)``.

The families are every model type of transformers' ``CONFIG_MAPPING`` whose model class is a sequence-to-sequence LM
(``MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES``) or a speech sequence-to-sequence model
(``MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES``), read from transformers, not listed here. Each is built from
``shrunk_config`` (tests/model_sources: width 32, 2 layers, vocabulary 128) with :data:`OVERRIDES` where a family needs
more (:data:`FACTORIES` for the two composite models), random weights widened so that greedy tokens vary
(transformers' small initialisation repeats one token), eval mode. A model type whose config is not an
encoder-decoder (a decoder-only LM with an audio encoder: Qwen2-Audio, Voxtral, ...) is listed as such, not
converted: the audio-language decoders are swept by ``benchmarks/vision_language_families.py --audio``.

For each encoder-decoder, in a process of its own (a crash or a hang is that family's row): transformers' own
``model.generate`` must run on the small config (else the row says "cannot run eagerly" and why); then
``pipeline.convert(model, inputs, generation={"max_length": 32, "max_batch": 8}, precision=..., validate=True)`` on
ONNX Runtime (``--precision``: fp32, or fp16 judged by the conversion's validation under the accuracy policy); greedy
12 new tokens for a batch of 2 (token inputs right-padded, as tokenizers pad; speech features or waveforms
of the length the encoder takes) and beam search with 4 beams compared with ``model.generate``'s sequences (a model
whose ``generate`` leaves its decoder prompt out, as Whisper's does, is compared on the tokens it returns; one whose
class wraps transformers' generic loop with its own pre- or post-processing is also compared with that loop, and the
row says so; a model whose ``generate`` has no beam search says n/a); every greedy step's scores compared with
transformers' (``output_scores``: the largest difference, 1e-3 the fp32 goal); the module saved and loaded back gives
the same greedy tokens; then the family is converted again for TensorRT-RTX (the same precision, ``validate=False``),
whose real builder builds both graphs ahead of time on this CPU machine. "greedy tokens" is the shape of transformers'
greedy sequences and how many distinct tokens they hold.

Run from the repository root::

    python benchmarks/encoder_decoder_families.py                  # every family, the markdown table
    python benchmarks/encoder_decoder_families.py --only bart t5 whisper
    python benchmarks/encoder_decoder_families.py --json families.json
    python benchmarks/encoder_decoder_families.py --precision fp16 --json families16.json
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

# the repository first: with an editable install tests/pipeline (a test folder, no __init__) would otherwise be
# taken as a namespace package `pipeline` before the install's finder is asked
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.append(str(Path(__file__).resolve().parents[1] / "tests"))
import tests_environment  # noqa: E402, F401 -- torchvision's operator schemas, before transformers imports it
import torch  # noqa: E402
import transformers as tf  # noqa: E402
from family_sweep import (  # noqa: E402
    PRECISIONS,
    CannotRunEagerly,
    first_line,
    lively,
    row_of,
    rtx_builds,
    run_isolated,
    score_cell,
    scores_clause,
    scores_gap,
)
from model_sources.transformers_models import shrunk_config  # noqa: E402
from transformers.generation.utils import GenerationMixin  # noqa: E402
from transformers.models.auto import modeling_auto  # noqa: E402

import pipeline  # noqa: E402

NEW_TOKENS = 12
BEAMS = 4
BATCH = 2
GENERATION = {"max_length": 32, "max_batch": BATCH * BEAMS}
#: the weights' standard deviation times the square root of their fan-in (matrices and kernels only: norms and biases
#: keep theirs): wide enough that greedy tokens vary, scaled so that activations keep their size through the layers
WEIGHT_GAIN = 1.5
#: audio samples of a raw-waveform input (``input_values``)
SAMPLES = 4000

#: what every family gets beyond ``shrunk_config``'s sizes: the cache on, as every checkpoint ships it (SMALL turns it
#: off for the plain forward's export)
BASE: dict[str, Any] = {"use_cache": True}
#: model_type -> config overrides beyond ``shrunk_config``'s sizes and :data:`BASE`, each with its reason
OVERRIDES: dict[str, dict[str, Any]] = {
    # T5's and Pop2Piano's checkpoints set decoder_start_token_id=0 (the pad token) in config.json; their config
    # classes have no default, and generate refuses to start without one
    "t5": {"decoder_start_token_id": 0},
    "pop2piano": {"decoder_start_token_id": 0},
    # FSMT names its vocabularies per side (42024 each by default)
    "fsmt": {"src_vocab_size": 128, "tgt_vocab_size": 128},
    # ProphetNet names its encoder's layers and both sides' heads its own way (12 layers, 16 heads of 2 dims)
    "prophetnet": {"num_encoder_layers": 2, "num_encoder_attention_heads": 2, "num_decoder_attention_heads": 2},
    # LED's window of 512 pads the 7-token sample to 512; and its sliding-chunk attention views the states with a
    # size computed as a tensor unless config.onnx_export asks for its export-friendly unfold (transformers' own knob)
    "led": {"attention_window": 4, "onnx_export": True},
    # PEGASUS-X's blocks of 512 and 32 global tokens, to the sample's scale
    "pegasus_x": {"block_size": 8, "num_global_tokens": 4},
    # the speech encoder's sizes have their own names (24 layers, 16 heads, 4096 wide, 128 positional convolutions)
    "seamless_m4t": {
        "speech_encoder_layers": 2,
        "speech_encoder_attention_heads": 2,
        "speech_encoder_intermediate_size": 64,
        "num_conv_pos_embeddings": 16,
        "num_conv_pos_embedding_groups": 2,
    },
    "seamless_m4t_v2": {
        "speech_encoder_layers": 2,
        "speech_encoder_attention_heads": 2,
        "speech_encoder_intermediate_size": 64,
        "num_conv_pos_embeddings": 16,
        "num_conv_pos_embedding_groups": 2,
    },
    # the convolutional subsampler's 1024 channels
    "speech_to_text": {"conv_channels": 32},
    # Dia's decoder reads the encoder's width and its cross-attention heads under their own names (1024, 16 x 128)
    "dia": {
        "decoder_config": {
            "cross_hidden_size": 32,
            "cross_head_dim": 16,
            "cross_num_attention_heads": 2,
            "cross_num_key_value_heads": 2,
            "use_cache": True,
        }
    },
    # the decoder reads config.num_key_value_heads, which MoonshineStreamingConfig does not define (transformers'
    # own default config fails the same way)
    "moonshine_streaming": {"num_key_value_heads": 2},
}


def composite(encoder_type: str, **encoder_overrides: Any) -> Callable[[], Any]:
    """The config of a composite encoder-decoder (``EncoderDecoderModel``, ``SpeechEncoderDecoderModel``): a shrunk
    encoder of ``encoder_type`` and a shrunk BERT decoder with cross-attention, as transformers' docs pair them; the
    start and padding tokens a checkpoint's config sets (the composite config has none of its own)."""

    def make() -> Any:
        encoder = shrunk_config(encoder_type, {**BASE, **encoder_overrides})
        decoder = shrunk_config("bert", {**BASE, "is_decoder": True, "add_cross_attention": True})
        kind = "speech-encoder-decoder" if encoder_type != "bert" else "encoder-decoder"
        config_class: Any = tf.CONFIG_MAPPING[kind]
        config = config_class.from_encoder_decoder_configs(encoder, decoder)
        config.decoder_start_token_id, config.pad_token_id, config.eos_token_id = 1, 0, 2
        return config

    return make


#: model_type -> a function building its config, for the composite models whose config is two others
FACTORIES: dict[str, Callable[[], Any]] = {
    "encoder-decoder": composite("bert"),
    # the feature encoder's seven convolutions narrowed (512 channels by default)
    "speech-encoder-decoder": composite("wav2vec2", conv_dim=[32] * 7),
}

#: model_type -> generation config values a checkpoint's generation_config.json holds and ``generate`` needs
GENERATION_CONFIG: dict[str, dict[str, Any]] = {
    # Pop2Piano's generate refuses to run without the composer tokens its hub generation_config.json lists (one per
    # composer embedding: 21)
    "pop2piano": {"composer_to_feature_token": {f"composer{i + 1}": 100 + i for i in range(21)}},
}


def families() -> dict[str, str]:
    """model_type -> model class name, for every sequence-to-sequence model type transformers maps."""
    names = {
        **modeling_auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
        **modeling_auto.MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES,
    }
    mapping = tf.CONFIG_MAPPING
    return {kind: name if isinstance(name, str) else name[0] for kind, name in sorted(names.items()) if kind in mapping}


def make_config(kind: str) -> Any:
    """The family's small config: ``shrunk_config`` with :data:`BASE` and the family's :data:`OVERRIDES`; a sub-config
    typed ``AutoConfig`` (an encoder of another model type: Canary's Parakeet encoder) shrunk as its own model type; an
    override the constructor does not take set on the config afterwards (as a checkpoint's config.json holds it), a
    dict of overrides for a sub-config set on that sub-config."""
    factory = FACTORIES.get(kind)
    if factory is not None:
        return factory()
    overrides = {**BASE, **OVERRIDES.get(kind, {})}
    nested = {name: value for name, value in overrides.items() if isinstance(value, dict)}
    flat = {name: value for name, value in overrides.items() if name not in nested}
    default = tf.CONFIG_MAPPING[kind]()
    for name, sub in (getattr(type(default), "sub_configs", None) or {}).items():
        value = getattr(default, name, None)
        if getattr(sub, "__name__", "") == "AutoConfig" and value is not None:
            flat[name] = shrunk_config(value.model_type, {**BASE, **OVERRIDES.get(value.model_type, {})})
    config = shrunk_config(kind, flat)
    for name, value in flat.items():
        if not hasattr(config, name) or (getattr(config, name) != value and not hasattr(value, "to_dict")):
            setattr(config, name, value)
    for name, values in nested.items():
        for key, value in values.items():
            setattr(getattr(config, name), key, value)
    return config


def encoder_inputs(kind: str, model: Any) -> dict[str, torch.Tensor]:
    """The encoder's inputs for a batch of two: token ids right-padded (the second row 2 tokens shorter), speech
    features or waveforms of the length the encoder takes."""
    config = model.config
    generator = torch.Generator().manual_seed(1)
    main = INPUT_NAMES.get(kind, str(getattr(model, "main_input_name", "input_ids")))
    if main == "input_ids":
        vocabulary = int(config.get_text_config().vocab_size) if hasattr(config, "get_text_config") else 128
        ids = torch.randint(4, min(vocabulary, 128), (BATCH, 7), generator=generator)
        mask = torch.ones_like(ids)
        mask[1, 5:] = 0
        pad = config.pad_token_id if isinstance(config.pad_token_id, int) else 0
        return {"input_ids": ids.masked_fill(mask == 0, pad), "attention_mask": mask}
    shape = FEATURES.get(kind)
    if shape is not None:
        return {main: torch.randn((BATCH, *shape(config)), generator=generator)}
    if main in ("input_values", "inputs"):
        return {main: torch.randn(BATCH, SAMPLES, generator=generator)}
    raise CannotRunEagerly(f"no sample for the encoder input {main!r} (add the family to FEATURES)")


#: model_type -> the encoder input its ``generate`` takes where that is not the model's ``main_input_name``
INPUT_NAMES = {
    # Pop2Piano's main_input_name says input_ids; its generate takes the audio's input_features [frames, d_model]
    "pop2piano": "input_features",
}

#: model_type -> the shape of one row of ``input_features`` the encoder takes, from its config
FEATURES: dict[str, Callable[[Any], tuple[int, ...]]] = {
    # [mel bins, frames]: the encoder's two convolutions (the second of stride 2) give max_source_positions states,
    # and Whisper checks the frames are exactly twice that
    "whisper": lambda c: (c.num_mel_bins, 2 * c.max_source_positions),
    # [frames, features]: two convolutions of stride 2 (60 frames -> 15 states, within max_source_positions 16)
    "speech_to_text": lambda c: (60, c.input_feat_per_channel * c.input_channels),
    # [frames, filter banks]: the conformer's adapter strides by 8 (40 frames -> 5 states)
    "seamless_m4t": lambda c: (40, c.feature_projection_input_dim),
    "seamless_m4t_v2": lambda c: (40, c.feature_projection_input_dim),
    # [frames, mel bins]: Parakeet's subsampling divides the frames by 8 (64 -> 8 states)
    "canary": lambda c: (64, c.encoder_config.num_mel_bins),
    "cohere_asr": lambda c: (64, c.encoder_config.num_mel_bins),
    # [frames, d_model]: the features go in as the encoder's embeddings
    "pop2piano": lambda c: (8, c.d_model),
}


def same(expected: torch.Tensor, actual: torch.Tensor) -> bool:
    """The sequences are equal, or ``expected`` is ``actual`` without its decoder prompt (Whisper's ``generate``
    returns the new tokens only)."""
    width = expected.shape[1]
    if expected.shape[0] != actual.shape[0] or width > actual.shape[1]:
        return False
    return torch.equal(expected, actual[:, actual.shape[1] - width :])


def verdict(
    model: Any, inputs: dict[str, torch.Tensor], expected: torch.Tensor, actual: torch.Tensor, **options: Any
) -> Any:
    """True when ``actual`` is ``model.generate``'s ``expected``; "generic" when it is what transformers' generic
    ``GenerationMixin.generate`` gives, where the model's class wraps that loop with its own pre- or post-processing
    (Whisper's turns a final eos into padding); else False."""
    if same(expected, actual):
        return True
    if type(model).generate is GenerationMixin.generate:
        return False
    try:
        with torch.no_grad():
            generic = GenerationMixin.generate(model, **inputs, **options)
    except Exception:  # noqa: BLE001 - the generic loop refuses what only the model's own generate takes
        return False
    return "generic" if same(generic, actual) else False


def run_family(kind: str, class_name: str, precision: str, row: dict[str, Any]) -> dict[str, Any]:
    """One family's row (see the module docstring), filled in ``row`` as it goes."""
    default = tf.CONFIG_MAPPING[kind]()
    if not getattr(default, "is_encoder_decoder", False):
        row["converts"] = "not an encoder-decoder"
        row["error"] = (
            f"{type(default).__name__}.is_encoder_decoder is False (a decoder-only LM with an encoder: "
            "an audio-language decoder, swept by vision_language_families.py --audio)"
        )
        return row
    try:
        config = make_config(kind)
    except Exception as error:  # noqa: BLE001 - transformers refuses its own small config: the row says why
        raise CannotRunEagerly(f"config: {type(error).__name__}: {first_line(error)}") from error
    # num_beams=1 said: a generation config may default to beam search (FSMT's to 5 beams)
    greedy = {"max_new_tokens": NEW_TOKENS, "do_sample": False, "num_beams": 1}
    beam = {**greedy, "num_beams": BEAMS}
    scored = {**greedy, "output_scores": True, "return_dict_in_generate": True}
    try:
        torch.manual_seed(0)
        model: Any = lively(getattr(tf, class_name)(config), gain=WEIGHT_GAIN)
        for name, value in GENERATION_CONFIG.get(kind, {}).items():
            setattr(model.generation_config, name, value)
        inputs = encoder_inputs(kind, model)
        with torch.no_grad():
            expected_greedy = model.generate(**inputs, **greedy)
    except CannotRunEagerly:
        raise
    except Exception as error:  # noqa: BLE001 - transformers' own failure on the small config: the row says why
        raise CannotRunEagerly(f"{type(error).__name__}: {first_line(error)}") from error
    try:
        with torch.no_grad():
            expected_beam = model.generate(**inputs, **beam)
    except Exception as error:  # noqa: BLE001 - a model whose own generate has no beam search: the row says so
        expected_beam = None
        row["beam"] = f"n/a: transformers' {type(error).__name__}: {first_line(error)[:120]}"
    row["tokens"] = f"{tuple(expected_greedy.shape)}, {len(set(expected_greedy.flatten().tolist()))} distinct"
    start = time.perf_counter()
    try:
        module = pipeline.convert(model, inputs, generation=GENERATION, precision=precision, validate=True)
    except pipeline.InputError as error:
        if expected_greedy.dim() == 2:
            raise
        # several ids per row and step (Dia's one per audio codebook): the conversion's refusal, with what it meets
        raise pipeline.InputError(
            f"not one token per row and step: transformers' generate returns sequences of "
            f"{tuple(expected_greedy.shape)} ({expected_greedy.shape[-1]} ids per row and step), generation= "
            f"decodes one token id per row and step; {error.message}",
            fix=error.fix,
        ) from error
    row["convert_s"] = round(time.perf_counter() - start, 1)
    row["converts"] = "yes"
    if "input_ids" in inputs:
        shape = next(spec.shape for spec in module.encoder.io.inputs if spec.name == "input_ids")
        if isinstance(shape[1], int):  # the encoder fixes the source length (block padding in Python)
            row["error"] = f"source length fixed at the sample's {shape[1]} tokens"
    ours = module.generate(**inputs, **greedy)
    row["greedy"] = verdict(model, inputs, expected_greedy, ours, **greedy)
    if expected_beam is not None:
        row["beam"] = verdict(model, inputs, expected_beam, module.generate(**inputs, **beam), **beam)
    row["scores"] = score_cell(scores(model, module, inputs, scored), precision)
    with tempfile.TemporaryDirectory() as directory:
        module.save(Path(directory) / kind)
        loaded = pipeline.load(Path(directory) / kind)
        row["reloaded"] = torch.equal(loaded.generate(**inputs, **greedy), ours)
    row["rtx"] = rtx_builds(model, inputs, GENERATION, precision)
    return row


def scores(model: Any, module: Any, inputs: dict[str, torch.Tensor], options: dict[str, Any]) -> float | str:
    """Every greedy step's scores against ``model.generate``'s (:func:`family_sweep.scores_gap`); against transformers'
    generic loop where the model's class wraps it (as :func:`verdict` does) and its own returns none."""
    with torch.no_grad():
        expected = model.generate(**inputs, **options)
    gap = scores_gap(expected, module.generate(**inputs, **options))
    if isinstance(gap, str) and gap.startswith("n/a") and type(model).generate is not GenerationMixin.generate:
        with torch.no_grad():
            gap = scores_gap(GenerationMixin.generate(model, **inputs, **options), module.generate(**inputs, **options))
    return gap


def markdown(rows: list[dict[str, Any]]) -> str:
    """The results table."""
    head = "| family | converts | greedy equal | greedy scores, max difference | beam (4) equal | saved + loaded |"
    head += " TensorRT-RTX builds | convert s | greedy tokens |"
    lines = [head + " error (or note) |", "|---" * (head.count("|")) + "|"]
    yes = {True: "yes", False: "**no**", None: "", "generic": "yes, as the generic loop (see below)"}
    for r in rows:
        cells = [
            r["family"],
            r.get("converts", ""),
            yes[r.get("greedy")],
            r.get("scores", ""),
            r["beam"] if isinstance(r.get("beam"), str) and r["beam"].startswith("n/a") else yes[r.get("beam")],
            yes[r.get("reloaded")],
            r.get("rtx", ""),
            r.get("convert_s", ""),
            r.get("tokens", ""),
            r.get("error", ""),
        ]
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


def summary(rows: list[dict[str, Any]], precision: str) -> str:
    """How many rows are encoder-decoders, run eagerly, convert, and decode as transformers does."""
    pairs = [r for r in rows if r.get("converts") != "not an encoder-decoder"]
    eager = [r for r in pairs if r.get("converts") != "cannot run eagerly"]
    converted = [r for r in eager if r.get("converts") == "yes"]
    equal = [r for r in converted if r.get("greedy") and r.get("beam") is not False and r.get("reloaded")]
    built = [r for r in converted if str(r.get("rtx", "")).startswith("yes")]
    return (
        f"{len(rows)} model types, {precision}: {len(pairs)} encoder-decoders, {len(eager)} of them run eagerly from "
        f"the small config, {len(converted)} convert (validated), {len(equal)} decode as transformers does (greedy, "
        f"beam search where the model's generate has it, and saved + loaded){scores_clause(converted, precision)}, "
        f"TensorRT-RTX builds both graphs of {len(built)}"
    )


def main() -> None:
    """Run the families and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="model types (as transformers names them: bart, t5, whisper)")
    parser.add_argument("--json", help="write the rows to this file")
    parser.add_argument("--timeout", type=float, default=900, help="seconds one family may take")
    parser.add_argument("--precision", choices=PRECISIONS, default="fp32", help="the conversions' precision")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # one family, its row printed as JSON
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    warnings.simplefilter("ignore")
    every = families()
    if args.child:
        print(json.dumps(row_of(run_family, args.child, every[args.child], args.precision)), flush=True)
        return
    wanted = set(args.only or ())
    unknown = wanted - set(every)
    if unknown:
        parser.error(f"not sequence-to-sequence model types: {sorted(unknown)}")
    print(f"{len(every)} sequence-to-sequence model types in transformers {tf.__version__}", flush=True)
    rows = []
    for kind in every:
        if wanted and kind not in wanted:
            continue
        row = run_isolated(__file__, kind, args.timeout, ["--precision", args.precision])
        print(json.dumps(row), flush=True)
        rows.append(row)
    print(markdown(rows))
    print(summary(rows, args.precision))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
