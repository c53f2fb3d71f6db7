"""Next-token choice: greedy at temperature 0, otherwise temperature and nucleus (top_p) sampling, seedable."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from local_engine.prompt.tool_name_constraint import ToolNameConstraint


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
    # A forced tool call whose name the model writes: the name is decoded constrained to one of these.
    tool_names: tuple[str, ...] = ()


class Sampler:
    """One per request, so a seeded request draws the same tokens whatever else the engine is doing."""

    def __init__(self, params: SamplingParams, constraint: ToolNameConstraint | None = None) -> None:
        self.params = params
        self.constraint = constraint
        self._generator: torch.Generator | None = None
        if params.temperature > 0:
            self._generator = torch.Generator(device="cpu")
            if params.seed is not None:
                self._generator.manual_seed(params.seed)
            else:
                self._generator.seed()

    @property
    def is_greedy(self) -> bool:
        """Greedy requests take the argmax, which the engine computes for a whole batch at once (not while a
        constraint applies)."""
        return self._generator is None and (self.constraint is None or self.constraint.done)

    def next_token(self, logits: torch.Tensor) -> int:
        """`logits`: `[vocab]` float32."""
        if self.constraint is not None and not self.constraint.done:
            token = self._draw(self.constraint.mask(logits))
            self.constraint.accept(token)
            return token
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
