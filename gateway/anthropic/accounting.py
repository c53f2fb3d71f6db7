"""Prompt tokens as Anthropic's usage reports them: cache reads, cache writes (per lifetime class) and the rest.

Anthropic's definitions ("Prompt caching", "Tracking cache performance"): `cache_read_input_tokens` were served from
cache, `cache_creation_input_tokens` were written to it (the prefix up to the last breakpoint that was not read),
split into `cache_creation.ephemeral_5m_input_tokens` / `ephemeral_1h_input_tokens` by the lifetime of the
breakpoint that covers them, and `input_tokens` are the tokens after the last breakpoint. The three add up to the
prompt. A prefix shorter than the model's minimum cacheable length is neither written nor read: a breakpoint before it
marks nothing, and a match shorter than it (say, the chat template's opening tokens that every prompt shares) is not
reported as a read.

Here the engine caches every prompt, so a read is what the engine reports as matched, capped at the last breakpoint
that is long enough. A breakpoint's position, in tokens, is the length of the common token prefix of the request cut
at the breakpoint and the whole request, both tokenized by the engine with its chat template (so it includes the
first token of the turn that follows, which both renderings share).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gateway.anthropic.request import TTL_1H


@dataclass(frozen=True, slots=True)
class CachePoint:
    """A breakpoint's position (tokens of the prompt before and including it) and lifetime class."""

    position_tokens: int
    ttl: str


@dataclass(frozen=True, slots=True)
class CacheUsage:
    """Anthropic's prompt-side usage fields. `input_tokens + cache_read + cache_creation == prompt_tokens`."""

    input_tokens: int
    cache_read_input_tokens: int
    cache_creation_input_tokens: int
    ephemeral_5m_input_tokens: int
    ephemeral_1h_input_tokens: int

    @property
    def prompt_tokens(self) -> int:
        return self.input_tokens + self.cache_read_input_tokens + self.cache_creation_input_tokens

    def as_dict(self, output_tokens: int | None = None) -> dict[str, object]:
        usage: dict[str, object] = {
            "input_tokens": self.input_tokens,
            "cache_creation_input_tokens": self.cache_creation_input_tokens,
            "cache_read_input_tokens": self.cache_read_input_tokens,
            "cache_creation": {
                "ephemeral_5m_input_tokens": self.ephemeral_5m_input_tokens,
                "ephemeral_1h_input_tokens": self.ephemeral_1h_input_tokens,
            },
        }
        if output_tokens is not None:
            usage["output_tokens"] = output_tokens
        return usage


def no_cache(prompt_tokens: int) -> CacheUsage:
    return CacheUsage(prompt_tokens, 0, 0, 0, 0)


def split_usage(
    prompt_tokens: int, matched_tokens: int, points: Sequence[CachePoint], min_cacheable_tokens: int
) -> CacheUsage:
    """Split `prompt_tokens` into reads, writes per class and the rest.

    `matched_tokens`: what the engine served from cache; `points`: the breakpoints in prompt order; breakpoints
    before `min_cacheable_tokens` tokens mark nothing. Positions are clamped to the prompt.
    """
    prompt_tokens = max(0, prompt_tokens)
    eligible = [
        CachePoint(min(p.position_tokens, prompt_tokens), p.ttl)
        for p in points
        if p.position_tokens >= min_cacheable_tokens and p.position_tokens > 0
    ]
    if not eligible:
        return no_cache(prompt_tokens)
    last = max(p.position_tokens for p in eligible)
    read = max(0, min(matched_tokens, last))
    if read < min_cacheable_tokens:
        read = 0  # nothing that short is ever cached, so nothing that short is read
    written = {"5m": 0, TTL_1H: 0}
    previous = 0
    for point in sorted(eligible, key=lambda p: p.position_tokens):
        start = max(previous, read)
        if point.position_tokens > start:
            written[TTL_1H if point.ttl == TTL_1H else "5m"] += point.position_tokens - start
        previous = max(previous, point.position_tokens)
    creation = written["5m"] + written[TTL_1H]
    return CacheUsage(prompt_tokens - read - creation, read, creation, written["5m"], written[TTL_1H])


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading items `a` and `b` share."""
    limit = min(len(a), len(b))
    for index in range(limit):
        if a[index] != b[index]:
            return index
    return limit
