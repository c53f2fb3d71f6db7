"""One step's next tokens for a batch: each request's logits changes and grammar mask on its own row, then the
batch's argmax for greedy rows and each sampler's own draw for the rest, with log-probabilities where asked.

Log-probabilities are those of the model's raw distribution (`log_softmax` of the logits, fp32, before penalties,
bias, grammar masks and temperature), as vLLM reports them by default.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from local_engine.engine.types import TokenLogprob
from local_engine.engine.sampling import Sampler
from local_engine.engine.structured_output import GrammarMasks


@dataclass(frozen=True)
class SampledToken:
    token_id: int
    logprob: float  # raw log-probability of the token (0.0 when neither logprobs nor best_of asked for it)
    entry: TokenLogprob | None  # what the client is sent, when it asked for logprobs


def logprob_entry(row_logprobs: torch.Tensor, token_id: int, num_top: int) -> TokenLogprob:
    """`row_logprobs`: float32 `[vocab]` log-softmax of one position's logits."""
    top: tuple[tuple[int, float], ...] = ()
    if num_top > 0:
        values, ids = torch.topk(row_logprobs, num_top)
        top = tuple(zip(ids.tolist(), values.tolist()))
    return TokenLogprob(token_id, float(row_logprobs[token_id]), top)


def _wants_logprobs(sampler: Sampler) -> bool:
    params = sampler.params
    return params.logprobs is not None or params.best_of > params.n


@torch.inference_mode()  # the logits come from the model's inference-mode forward and are changed in place
def sample_rows(logits: torch.Tensor, rows: list[list[Sampler]], masks: GrammarMasks | None) -> list[list[SampledToken]]:
    """`logits`: float32 `[len(rows), vocab]`, changed in place. `rows[i]`: the samplers drawing from row i: one
    request, or a request and the sequences forked from it at its first token (all in the same state, so the first
    one's logits changes and mask stand for all). Returns the tokens drawn, in the same shape, each already accepted
    by its sampler."""
    wanted = [i for i, samplers in enumerate(rows) if any(_wants_logprobs(s) for s in samplers)]
    raw = torch.log_softmax(logits[wanted], dim=-1) if wanted else None
    raw_row = {row: j for j, row in enumerate(wanted)}
    for i, samplers in enumerate(rows):
        if samplers[0].adjuster is not None:
            samplers[0].adjuster.apply(logits[i])
    constrained = [(i, samplers[0].matcher) for i, samplers in enumerate(rows)
                   if samplers[0].matcher is not None and not samplers[0].matcher.is_error()]
    if constrained and masks is not None:
        masks.apply(logits, constrained)
    greedy = logits.argmax(dim=-1).tolist() if logits.shape[0] else []
    drawn: list[list[SampledToken]] = []
    for i, samplers in enumerate(rows):
        out = []
        for sampler in samplers:
            token = greedy[i] if sampler.is_greedy else sampler.next_token(logits[i])
            sampler.accept(token)
            if i in raw_row:
                row_logprobs = raw[raw_row[i]]
                entry = logprob_entry(row_logprobs, token, sampler.params.logprobs or 0)
                out.append(SampledToken(token, entry.logprob,
                                        entry if sampler.params.logprobs is not None else None))
            else:
                out.append(SampledToken(token, 0.0, None))
        drawn.append(out)
    return drawn
