"""A request's engine state: its sequences (one, or `n`/`best_of` of them), each with its detokenizer and a sampler
that holds what changes its logits (penalties and biases, a grammar matcher)."""

from __future__ import annotations

import asyncio

from local_engine.engine.logits_processors import LogitsAdjuster
from local_engine.engine.sampling import Sampler
from local_engine.engine.sequence import Sequence
from local_engine.engine.structured_output import GrammarMasks
from local_engine.engine.types import GenerationRequest, RequestHandle
from local_engine.model.loader import LoadedModel
from local_engine.prompt.detokenizer import IncrementalDetokenizer


class SequenceBuilder:
    """One per engine: it keeps the grammar's per-tokenizer index (built at first use)."""

    def __init__(self, loaded: LoadedModel) -> None:
        self.loaded = loaded
        self.grammar_masks = GrammarMasks(loaded.tokenizer, loaded.eos_token_ids)

    async def build(self, request: GenerationRequest, handle: RequestHandle) -> Sequence:
        """The request's first sequence, holding the others in `forks` until its prompt is computed. Raises
        InvalidRequest (naming `response_format`, or `tools` for tool calls' grammar) when its grammar does not
        build against the tokenizer."""
        params = request.sampling
        matcher = None
        if params.grammar is not None:
            # Building a matcher may take a while (the tokenizer's index the first time): off the event loop.
            matcher = await asyncio.to_thread(self.grammar_masks.matcher, params.grammar, params.grammar_param)
        sequences = [self._sequence(request, handle, index, matcher.deep_copy() if index and matcher else matcher)
                     for index in range(params.num_sequences)]
        sequences[0].forks = sequences[1:]
        return sequences[0]

    def _sequence(self, request: GenerationRequest, handle: RequestHandle, index: int, matcher) -> Sequence:
        params = request.sampling.for_sequence(index)
        adjuster = None
        if LogitsAdjuster.needed(params):
            adjuster = LogitsAdjuster(params, request.prompt_token_ids, self.loaded.eos_token_ids,
                                      self.loaded.vocab_size)
        return Sequence(
            request=request,
            handle=handle,
            detokenizer=IncrementalDetokenizer(self.loaded.tokenizer, params.stop, params.closing_json),
            sampler=Sampler(params, adjuster, matcher),
            index=index,
        )
