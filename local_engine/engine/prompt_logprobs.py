"""The prompt's log-probabilities (completions `echo` with `logprobs`, what evaluation harnesses read as a prompt's
log-likelihood): prompt token p's entry is the log-softmax of the logits at position p - 1 (the first token has none).

The cache keeps K/V, not logits, so a request that asks for them is computed whole (`Sequence.computes_whole_prompt`:
its admission matches nothing and reports 0 cached tokens); its prefill chunks return every position's logits.
"""

from __future__ import annotations

import torch

from local_engine.engine.batch_sampling import logprob_entry
from local_engine.engine.types import PromptLogprobs
from local_engine.engine.sequence import Sequence


def add_prompt_logprobs(sequence: Sequence, chunk_logits: torch.Tensor) -> None:
    """`chunk_logits`: float32 `[num_chunk_tokens, vocab]`, the logits of the chunk just computed (from position
    `sequence.num_computed_tokens`); records the entries of the prompt tokens they predict."""
    if sequence.prompt_logprobs is None:
        return
    first_position = sequence.num_computed_tokens
    prompt = sequence.prompt
    num_top = sequence.request.sampling.prompt_logprobs or 0
    logprobs = torch.log_softmax(chunk_logits, dim=-1)
    for offset in range(chunk_logits.shape[0]):
        target = first_position + offset + 1
        if target < len(prompt):
            sequence.prompt_logprobs[target] = logprob_entry(logprobs[offset], prompt[target], num_top)


def send_prompt_logprobs(sequence: Sequence) -> None:
    """Once its prompt is computed: the request's PromptLogprobs event, sent once, before any token."""
    if sequence.prompt_logprobs is None:
        return
    entries, sequence.prompt_logprobs = sequence.prompt_logprobs, None
    sequence.handle._emit(PromptLogprobs(sequence.prompt, tuple(entries[p] for p in sorted(entries))))
