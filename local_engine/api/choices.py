"""A request's sequences (`n`, `best_of`) collected from the engine's events into the choices a response returns."""

from __future__ import annotations

from dataclasses import dataclass, field

from local_engine.engine.types import Finished, PromptLogprobs, TokenDelta, TokenLogprob


@dataclass
class ChoiceResult:
    index: int
    texts: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finished: Finished | None = None

    @property
    def text(self) -> str:
        return "".join(self.texts)


class ChoiceCollector:
    """Feeds on one request's events; `best(n)` returns the `n` choices to send."""

    def __init__(self, num_sequences: int) -> None:
        self.choices = [ChoiceResult(index) for index in range(num_sequences)]
        self.prompt: PromptLogprobs | None = None

    def add(self, event: TokenDelta | PromptLogprobs | Finished) -> None:
        if isinstance(event, PromptLogprobs):
            self.prompt = event
        elif isinstance(event, TokenDelta):
            choice = self.choices[event.index]
            choice.texts.append(event.text)
            choice.logprobs.extend(event.logprobs)
        else:
            self.choices[event.index].finished = event

    @property
    def ends(self) -> list[Finished]:
        return [choice.finished for choice in self.choices if choice.finished is not None]

    def best(self, n: int) -> list[ChoiceResult]:
        """All choices when `n` is all of them; else (`best_of`) the `n` with the highest cumulative
        log-probability, renumbered from 0 in that order (OpenAI's definition of best_of)."""
        if n >= len(self.choices):
            return self.choices
        ranked = sorted(self.choices, key=lambda c: -c.finished.cumulative_logprob)[:n]
        return [ChoiceResult(i, c.texts, c.logprobs, c.finished) for i, c in enumerate(ranked)]
