"""The engines' settings for the benchmark (cheap to import: the command's defaults come from here)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineSettings:
    """Both engines: the model, tokens per page, KV pool capacity (tokens) and idle TTL (seconds). The pool is small
    enough for a few prompts of ~300 tokens, so another tenant's prompts evict; the TTL is short, so expiry takes
    seconds, yet long enough for a turn and its think time on a loaded CPU."""

    model: str = "smollm2"
    page_size: int = 16
    pool_tokens: int = 1024
    ttl_s: float = 15.0
