"""What the modules of a source graph and a cached step share (an encoder-decoder's encoder and decoder step, the
image graph and text step of a model whose text cross-attends to its images): the files of their saved directory, and
``generate``'s answer over a request's feed, beam search or the decoder-only module's loop (the vision-language
module's answer too)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from pipeline.runtime.generation.beam_search import BeamSettings, beam_search
from pipeline.runtime.generation.options import GenerateOptions
from pipeline.runtime.generation.outputs import beam_output, decoder_only_output
from pipeline.runtime.generation.request import Decoding, fill_token

#: The two artifacts of the saved directory: the source graph (an encoder, an image graph) and the cached step.
ENCODER_FILE, DECODER_FILE = "encoder.ptrt", "decoder.ptrt"
#: The first decoder step's graph, where a model's decoder takes another branch over an empty cache (ProphetNet's).
FIRST_STEP_FILE = "first_step.ptrt"


def generate_over(feed: Any, decoding: Decoding, request: GenerateOptions, encoder_decoder: bool) -> Any:
    """``generate``'s answer over a request's ``feed``: beam search or the greedy/sampled loop, the streamer told,
    the sequences (or transformers' output dict, of an encoder-decoder when ``encoder_decoder``)."""
    if request.num_beams > 1:
        settings = BeamSettings(
            request.num_beams, request.length_penalty, request.early_stopping, request.num_return_sequences
        )
        record = request.return_dict_in_generate and (request.output_scores or request.output_logits)
        processors = decoding.processors if decoding.processors else None
        fill = fill_token(decoding.eos, decoding.pad)
        result = beam_search(feed, settings, decoding.new, processors, decoding.criteria, decoding.eos, fill, record)
        if not request.return_dict_in_generate:
            return result.sequences
        return beam_output(result, request, encoder_decoder=encoder_decoder)
    streamer = request.streamer
    if streamer is not None:
        streamer.put(feed.ids)
    new = []
    for tokens in decode(feed, decoding):
        new.append(tokens)
        if streamer is not None:
            streamer.put(tokens)
    if streamer is not None:
        streamer.end()
    sequences = torch.cat([feed.ids, *(t[:, None] for t in new)], dim=1)
    if not request.return_dict_in_generate:
        return sequences
    chooser = decoding.chooser
    return decoder_only_output(sequences, chooser.scores, chooser.logits, request, encoder_decoder=encoder_decoder)


def decode(feed: Any, decoding: Decoding) -> Iterator[torch.Tensor]:
    """The decoder-only module's greedy or sampled loop over ``feed``
    (:func:`pipeline.runtime.generation.module.decode`)."""
    from pipeline.runtime.generation.module import decode as loop

    return loop(feed, decoding)
