"""Per-request changes to one request's next-token logits inside a batch, before temperature and top_p.

Applied in this order to the request's row of raw logits (`[vocab]` float32), as vLLM applies them:

- `logit_bias` (OpenAI): `logits[t] += bias[t]`, bias in [-100, 100], keyed by token id.
- `min_tokens` (vLLM): while fewer than `min_tokens` tokens are generated, every EOS token id is at -inf.
- `repetition_penalty` p (vLLM's extra; the CTRL paper's definition, Keskar et al. 2019, as in transformers'
  `RepetitionPenaltyLogitsProcessor`): for every token t seen in the prompt or the output,
  `logits[t] = logits[t] / p` where it is positive, `logits[t] * p` otherwise.
- `frequency_penalty` f and `presence_penalty` r (OpenAI's definition): over the output tokens only,
  `logits[t] -= f * count[t] + r * (count[t] > 0)`.

Each request keeps its own counts, so requests side by side in one batch never affect each other.
"""

from __future__ import annotations

import torch

from local_engine.engine.sampling import SamplingParams


class LogitsAdjuster:
    """One per request; `apply` changes a logits row in place, `accept` records the token drawn from it."""

    def __init__(self, params: SamplingParams, prompt_token_ids: tuple[int, ...], eos_token_ids: frozenset[int],
                 vocab_size: int) -> None:
        """`vocab_size`: the width of the model's logits rows. Token ids past it (never in a valid request) are
        ignored."""
        self.params = params
        self._eos = torch.tensor(sorted(t for t in eos_token_ids if t < vocab_size), dtype=torch.int64)
        self._bias_ids = torch.tensor([t for t, _ in params.logit_bias], dtype=torch.int64)
        self._bias_values = torch.tensor([b for _, b in params.logit_bias], dtype=torch.float32)
        self._vocab_size = vocab_size
        self._counts: torch.Tensor | None = None  # float32 [vocab]: times each token was generated
        self._seen: torch.Tensor | None = None  # bool [vocab]: in the prompt or the output
        self._prompt = prompt_token_ids
        self.num_generated = 0

    @staticmethod
    def needed(params: SamplingParams) -> bool:
        return bool(params.logit_bias or params.min_tokens or params.presence_penalty or params.frequency_penalty
                    or params.repetition_penalty != 1.0)

    def apply(self, logits: torch.Tensor) -> None:
        """`logits`: float32 `[vocab]`, changed in place."""
        params = self.params
        if params.logit_bias:
            logits.index_add_(0, self._bias_ids.to(logits.device), self._bias_values.to(logits.device))
        if self.num_generated < params.min_tokens and len(self._eos):
            logits.index_fill_(0, self._eos.to(logits.device), float("-inf"))
        if params.repetition_penalty != 1.0:
            seen = self._seen_mask(logits.device)
            penalized = torch.where(logits > 0, logits / params.repetition_penalty,
                                    logits * params.repetition_penalty)
            logits.copy_(torch.where(seen, penalized, logits))
        if (params.frequency_penalty or params.presence_penalty) and self._counts is not None:
            counts = self._counts.to(logits.device)
            logits.sub_(params.frequency_penalty * counts + params.presence_penalty * (counts > 0).float())

    def accept(self, token_id: int) -> None:
        self.num_generated += 1
        if token_id >= self._vocab_size:
            return
        if self.params.frequency_penalty or self.params.presence_penalty:
            if self._counts is None:
                self._counts = torch.zeros(self._vocab_size, dtype=torch.float32)
            self._counts[token_id] += 1
        if self._seen is not None:
            self._seen[token_id] = True

    def _seen_mask(self, device: torch.device) -> torch.Tensor:
        if self._seen is None:
            self._seen = torch.zeros(self._vocab_size, dtype=torch.bool)
            prompt = torch.tensor([t for t in self._prompt if t < self._vocab_size], dtype=torch.int64)
            self._seen[prompt] = True
        return self._seen.to(device)
