"""The tiny transformers models the generation tests convert (random weights, nothing downloaded), in one place.

>>> model = tiny_llama(seed=3, num_hidden_layers=1)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import transformers

#: A Llama small enough to convert in seconds, with grouped KV heads (4 query heads over 2) and special tokens inside
#: its vocabulary of 96.
TINY_LLAMA: dict[str, Any] = {
    "vocab_size": 96,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
    "eos_token_id": 95,
    "pad_token_id": 0,
}


#: A tiny decoder's text config (two layers of width 32, one key-value head of 16): the text model of the tests'
#: vision- and audio-language models, widened or given more keys where a family needs them.
TINY_TEXT: dict[str, Any] = {
    "vocab_size": 128,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 16,
}


def tiny_llama(seed: int = 0, **config: Any) -> transformers.LlamaForCausalLM:
    """:data:`TINY_LLAMA` with ``config``'s changes, its weights drawn after ``torch.manual_seed(seed)``; eval mode."""
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**TINY_LLAMA, **config})).eval()


def tiny_step(model: transformers.PreTrainedModel, *, max_length: int, max_batch: int) -> Any:
    """``model`` converted as a cached decoder step (not validated: the tests compare it with the model themselves)
    from a 6-token prompt; the :class:`~pipeline.GenerativeModule`."""
    import pipeline

    ids = torch.randint(1, 90, (1, 6), generator=torch.Generator().manual_seed(1))
    module = pipeline.convert(model, ids, generation={"max_length": max_length, "max_batch": max_batch}, validate=False)
    assert isinstance(module, pipeline.GenerativeModule)
    return module


def left_padded(lengths: list[int], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts of ``lengths`` tokens (ids 1-89), left-padded with the pad id 0 to the longest; ids and mask."""
    ids = torch.randint(1, 90, (len(lengths), max(lengths)), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(ids)
    for row, length in enumerate(lengths):
        mask[row, : max(lengths) - length] = 0
    return ids.masked_fill(mask == 0, 0), mask


def lively(make: Callable[[], Any], seed: int, std: float, *, keep_eos: bool = True) -> Any:
    """The model ``make`` builds (after ``torch.manual_seed(seed)``), every weight of two or more dimensions drawn
    again with ``std``, wide enough that its greedy tokens vary (transformers' small initialisation gives one token
    repeated, which a decoding bug would also give); ``keep_eos=False``: no end-of-sequence token, so that every row
    decodes every token. Eval mode."""
    torch.manual_seed(seed)
    model = make()
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() >= 2:
                parameter.normal_(0.0, std)
    if not keep_eos:
        model.generation_config.eos_token_id = None
    return model.eval()


def drawn_by_fan_in(model: Any, generator: torch.Generator | None = None) -> Any:
    """``model`` in eval mode, every weight of two or more dimensions drawn again with standard deviation 1.5 /
    sqrt(fan-in) (the family sweeps' rule: greedy tokens vary, and deep stacks stay finite) from ``generator`` (seed
    0 when none), and no end-of-sequence token, so that every row decodes every token."""
    generator = generator if generator is not None else torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() >= 2:
                parameter.normal_(0, 1.5 / parameter.shape[-1] ** 0.5, generator=generator)
    model.generation_config.eos_token_id = None
    return model.eval()


def transformers_generate(model: Any, inputs: dict[str, torch.Tensor], **options: Any) -> torch.Tensor:
    """transformers' own ``model.generate`` on ``inputs``, greedy unless ``options`` say otherwise: the reference."""
    with torch.no_grad():
        return model.generate(**inputs, do_sample=False, **options)


def greedy_scores(generate: Any, inputs: dict[str, torch.Tensor], **options: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy tokens and every step's scores [steps, rows, vocabulary] of ``generate`` (the model's or a module's)."""
    with torch.no_grad():
        out = generate(**inputs, **{"do_sample": False, **options}, output_scores=True, return_dict_in_generate=True)
    return out.sequences, torch.stack([s.float() for s in out.scores])


def decodes_as_transformers(
    model: Any, module: Any, inputs: dict[str, torch.Tensor], **greedy: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """Assert that ``module`` decodes ``inputs`` as ``model.generate`` does: greedy tokens equal, every step's scores
    within 1e-3, 4-beam sequences equal; transformers' greedy tokens and scores."""
    expected, expected_scores = greedy_scores(model.generate, inputs, **greedy)
    tokens, scores = greedy_scores(module.generate, inputs, **greedy)
    assert torch.equal(tokens, expected)
    assert float((scores - expected_scores).abs().max()) < 1e-3
    beams = {**greedy, "num_beams": 4}
    with torch.no_grad():
        assert torch.equal(module.generate(**inputs, **beams), model.generate(**inputs, **beams))
    return expected, expected_scores


def decodes_its_audio_as_transformers(
    model: Any, module: Any, inputs: dict[str, torch.Tensor], *, distinct: int = 3, **greedy: Any
) -> torch.Tensor:
    """:func:`decodes_as_transformers`, with more than ``distinct`` distinct new tokens, and another audio (the
    ``input_features`` reversed in time) decoded otherwise, in both alike: the audio reaches the prompt (the check can
    fail). transformers' greedy tokens."""
    expected, _ = decodes_as_transformers(model, module, inputs, **greedy)
    assert len(set(expected[:, inputs["input_ids"].shape[1] :].flatten().tolist())) > distinct
    other = {**inputs, "input_features": inputs["input_features"].flip(-1)}
    with torch.no_grad():
        theirs = model.generate(**other, **greedy)
    assert torch.equal(module.generate(**other, **greedy), theirs) and not torch.equal(theirs, expected)
    return expected


def converted_for_rtx_when_it_imports(model: Any, inputs: dict[str, torch.Tensor], generation: dict[str, Any]) -> Any:
    """``model`` converted for generation, not validated: for TensorRT-RTX when it imports (its real builder on every
    graph, decomposed attention; its engines cannot run here, and the graphs run on ONNX Runtime beside them), else
    for ONNX Runtime."""
    import importlib.util

    import pipeline

    if importlib.util.find_spec("tensorrt_rtx") is not None:
        rtx = {**generation, "attention": "decomposed"}
        return pipeline.convert(model, inputs, generation=rtx, backend="tensorrt-rtx", validate=False)
    return pipeline.convert(model, inputs, generation=generation, validate=False)


def mixed_requests(module: Any, inputs: dict[str, torch.Tensor]) -> list[Callable[[], Any]]:
    """A generation module's mix of requests for :func:`answers_from_threads`: ``inputs`` greedy and with 2 beams, their
    first row alone, seeded sampling, and a stream of the first row."""
    first = {name: value[:1] for name, value in inputs.items()}
    return [
        partial(module.generate, **inputs, max_new_tokens=6),
        partial(module.generate, **inputs, max_new_tokens=5, num_beams=2),
        partial(module.generate, **first, max_new_tokens=6),
        partial(module.generate, **inputs, max_new_tokens=5, do_sample=True, top_k=20, seed=3),
        lambda: torch.stack(list(module.stream(**first, max_new_tokens=4))),
    ]


def answers_from_threads(requests: list[Callable[[], torch.Tensor]], threads: int = 6, each: int = 12) -> list[int]:
    """The requests whose answer, called from ``threads`` threads at once (``each`` requests per thread, in a random
    order), differs from the one computed alone beforehand: what a server calling one module must never see. Asserts
    that the requests' answers alone differ from each other (the check can fail)."""
    import random
    import threading
    from concurrent.futures import ThreadPoolExecutor

    expected = [request() for request in requests]
    assert len({tuple(answer.flatten().tolist()) for answer in expected}) == len(expected)
    start = threading.Barrier(threads)

    def worker(seed: int) -> list[tuple[int, torch.Tensor]]:
        order = random.Random(seed)
        start.wait()
        return [(index, requests[index]()) for index in (order.randrange(len(requests)) for _ in range(each))]

    with ThreadPoolExecutor(threads) as pool:
        answers = [answer for future in [pool.submit(worker, s) for s in range(threads)] for answer in future.result()]
    assert len(answers) == threads * each
    return [i for i, got in answers if got.shape != expected[i].shape or not torch.equal(got, expected[i])]


def requests_wait_for_slots(module: Any, inputs: dict[str, torch.Tensor]) -> None:
    """A generation module's request slots bound what runs at once: with one slot, an open stream holds it (a second
    stream in the same thread is refused at once, another thread's request waits and times out), closing it gives
    the slot back; with 2 slots, 6 threads still get every answer as alone, never more than 2 requests holding."""
    import threading

    import pytest

    from pipeline.runtime.generation.slots import RequestSlotsBusy

    slots, timeout = module.request_slots, module.request_timeout
    try:
        module.request_slots = 1
        first = {name: value[:1] for name, value in inputs.items()}
        stream = module.stream(**first, max_new_tokens=4)
        next(stream)
        assert module._request_slots().held == 1
        with pytest.raises(RequestSlotsBusy, match="already holds all 1 request slots"):
            next(module.stream(**first, max_new_tokens=4))
        module.request_timeout = 0.2
        refused: list[Exception] = []

        def other() -> None:
            try:
                module.generate(**first, max_new_tokens=2)
            except RequestSlotsBusy as error:
                refused.append(error)

        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        assert len(refused) == 1 and "stayed held for 0.2 s" in str(refused[0])
        stream.close()
        assert module._request_slots().held == 0
        module.request_timeout = None
        module.request_slots = 2
        most, watching = [0], threading.Event()

        def watch() -> None:
            while not watching.wait(0.0005):  # sampled, not spun: the slots' lock stays the requests'
                most[0] = max(most[0], module._request_slots().held)

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            assert answers_from_threads(mixed_requests(module, inputs)) == []
        finally:
            watching.set()
            watcher.join()
        assert most[0] == 2
    finally:
        module.request_slots, module.request_timeout = slots, timeout


def tone_wav(path: Any, seconds: float, hertz: float, rate: int = 16000) -> Any:
    """A 16-bit mono PCM WAV at ``rate`` of two tones (numpy's sine, the standard library's ``wave``); its path."""
    import wave

    import numpy as np

    times = np.arange(int(seconds * rate)) / rate
    samples = 0.4 * np.sin(2 * np.pi * hertz * times) + 0.2 * np.sin(2 * np.pi * 3.1 * hertz * times)
    with wave.open(str(path), "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(rate)
        writer.writeframes((samples * 32767).round().astype("<i2").tobytes())
    return path


def qwen_omni_thinker(mels: int, frames: int, positions: int = 64) -> Any:
    """A Qwen2.5-Omni thinker of width 32, drawn by fan-in: an audio encoder of 2 layers taking ``frames`` frames of
    ``mels`` mels (its output projected to the text width), a vision encoder of 2 and a text model of 2 of
    ``positions`` positions; tokens: audio 125 (start 123, end 124), image 127, video 126."""
    audio = {"num_mel_bins": mels, "encoder_layers": 2, "encoder_attention_heads": 2, "encoder_ffn_dim": 64}
    audio |= {"d_model": 32, "max_source_positions": frames // 2, "output_dim": 32}
    vision = {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "patch_size": 8}
    vision |= {"out_hidden_size": 32, "fullatt_block_indexes": [1]}
    text = {"vocab_size": 128, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2}
    text |= {"num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": positions}
    text |= {"rope_parameters": {"rope_theta": 1e6, "rope_type": "default", "mrope_section": [2, 3, 3]}}
    config = transformers.Qwen2_5OmniThinkerConfig(
        audio_config=audio, vision_config=vision, text_config=text, audio_token_index=125, image_token_index=127,
        audio_start_token_id=123, audio_end_token_id=124, video_token_index=126, vision_start_token_id=121,
        user_token_id=122,
    )  # fmt: skip
    torch.manual_seed(0)
    return drawn_by_fan_in(transformers.Qwen2_5OmniThinkerForConditionalGeneration(config))
