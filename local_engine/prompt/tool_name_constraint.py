"""Constrained decoding of a forced tool call's name.

With `tool_choice: "required"` and several tools, the prompt opens the call up to its name (`{"name": "`) and the
model writes the name. A small model often invents one, or goes on with other keys than "arguments". While the name
is written, only tokens that keep the text a prefix of one of the tools' names followed by `", "arguments": {` may
be drawn (the idea of grammar-constrained decoding, as vLLM's and SGLang's structured outputs apply it, for the part
of the call whose text is a closed set); the arguments' contents stay free.
"""

from __future__ import annotations

from collections import defaultdict

import torch

ARGUMENTS_OPENING = '", "arguments": {'  # what follows the name in the call's JSON (the Hermes format's order)


class TokenTexts:
    """Every token id's text (`tokenizer.decode([id])`), indexed by first character; built once per tokenizer."""

    def __init__(self, tokenizer) -> None:
        self.text = tokenizer.batch_decode([[token_id] for token_id in range(len(tokenizer))])
        self.by_first_char: dict[str, list[int]] = defaultdict(list)
        for token_id, text in enumerate(self.text):
            if text:
                self.by_first_char[text[0]].append(token_id)


class ToolNameConstraint:
    """Tracks the name written so far; `allowed_token_ids` says which tokens may come next, None once it is done."""

    def __init__(self, names: tuple[str, ...], texts: TokenTexts) -> None:
        self._targets = tuple(name + ARGUMENTS_OPENING for name in names)
        self._texts = texts
        self._written = ""
        self.done = not names

    def allowed_token_ids(self) -> list[int] | None:
        """Tokens whose text keeps the written text a prefix of a target (a name and the arguments' opening), or
        completes one (and may run past it)."""
        if self.done:
            return None
        written, allowed = self._written, []
        next_chars = {target[len(written)] for target in self._targets if target.startswith(written)}
        for char in next_chars:
            for token_id in self._texts.by_first_char.get(char, ()):
                candidate = written + self._texts.text[token_id]
                if any(target.startswith(candidate) or candidate.startswith(target) for target in self._targets):
                    allowed.append(token_id)
        return allowed or None

    def accept(self, token_id: int) -> None:
        self._written += self._texts.text[token_id]
        self.done = self.done or any(self._written.startswith(target) for target in self._targets)

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """`logits` `[vocab]` with every token outside `allowed_token_ids` at -inf (unchanged when unconstrained)."""
        allowed = self.allowed_token_ids()
        if allowed is None:
            return logits
        index = torch.tensor(allowed, dtype=torch.int64, device=logits.device)
        return torch.full_like(logits, float("-inf")).index_copy_(0, index, logits.index_select(0, index))
