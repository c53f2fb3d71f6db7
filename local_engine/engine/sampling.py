"""Next-token choice: greedy at temperature 0, otherwise temperature and nucleus (top_p) sampling, seedable; the
parameters of one request's generation."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from llguidance import LLMatcher

    from local_engine.engine.logits_processors import LogitsAdjuster


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    # JSON text the prompt opened (a forced tool call's body so far): generation ends where the output closes it.
    closing_json: str = ""
    # Per-request logits changes (`local_engine.engine.logits_processors` defines each).
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias in [-100, 100])
    min_tokens: int = 0
    # An llguidance grammar the output must match (`local_engine.engine.structured_output`), or None.
    grammar: str | None = None
    # The request field that set `grammar` (`response_format` or `tools`), named by a 400 if it does not build.
    grammar_param: str = "response_format"
    # Log-probabilities: None is off; k >= 0 returns each sampled token's and its k most likely alternatives'.
    logprobs: int | None = None
    # The prompt's log-probabilities too (completions `echo` with `logprobs`): the whole prompt is computed.
    prompt_logprobs: int | None = None
    # `n` sequences returned, `best_of` >= n sampled (the n with the highest cumulative log-probability are kept).
    n: int = 1
    best_of: int = 1

    @property
    def num_sequences(self) -> int:
        return max(self.n, self.best_of)

    def for_sequence(self, index: int) -> SamplingParams:
        """The parameters of the `index`-th of `num_sequences` sequences: its own seed stream (`seed + index`, as
        vLLM seeds the children of one request), the rest shared."""
        if index == 0 or self.seed is None:
            return self
        return replace(self, seed=self.seed + index)


class Sampler:
    """One per request, so a seeded request draws the same tokens whatever else the engine is doing."""

    def __init__(self, params: SamplingParams, adjuster: LogitsAdjuster | None = None,
                 matcher: LLMatcher | None = None) -> None:
        """`adjuster` (penalties, bias, min_tokens) and `matcher` (the grammar) change the request's logits row in
        the batch before a token is drawn (`local_engine.engine.batch_sampling`); `accept` tells both what was drawn."""
        self.params = params
        self.adjuster = adjuster
        self.matcher = matcher
        self._generator: torch.Generator | None = None
        if params.temperature > 0:
            self._generator = torch.Generator(device="cpu")
            if params.seed is not None:
                self._generator.manual_seed(params.seed)
            else:
                self._generator.seed()

    @property
    def is_greedy(self) -> bool:
        """Greedy requests take the argmax, which the engine computes for a whole batch at once (after the
        grammar's mask and the adjuster's changes)."""
        return self._generator is None

    def accept(self, token_id: int) -> None:
        """Record the token drawn for this request (after `next_token` or the batch's argmax)."""
        if self.adjuster is not None:
            self.adjuster.accept(token_id)
        if self.matcher is not None and not self.matcher.is_stopped():
            self.matcher.consume_token(token_id)

    def next_token(self, logits: torch.Tensor) -> int:
        """`logits`: `[vocab]` float32."""
        return self._draw(logits)

    def _draw(self, logits: torch.Tensor) -> int:
        if self._generator is None:
            return int(torch.argmax(logits))
        probs = torch.softmax(logits.float().cpu() / self.params.temperature, dim=-1)
        if self.params.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)
            # Keep the smallest set whose mass reaches top_p (always at least the most likely token).
            outside = torch.cumsum(sorted_probs, dim=-1) - sorted_probs >= self.params.top_p
            sorted_probs[outside] = 0.0
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
        return int(torch.multinomial(probs, 1, generator=self._generator))
