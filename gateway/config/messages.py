"""The `[messages]` section of `prefixscope.toml`: the minimum cacheable prefix per model.

    [messages]
    min_cacheable_tokens = 1024             # default for every model (Anthropic's minimum for most of its models)
    [messages.min_cacheable_tokens_by_model]
    "smollm2" = 256

A breakpoint whose prefix is shorter than its model's minimum marks nothing: no cache write, no cache read is
reported for it, as Anthropic does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.errors import ConfigError

DEFAULT_MIN_CACHEABLE_TOKENS = 1024


@dataclass(frozen=True)
class MessagesSettings:
    min_cacheable_tokens: int = DEFAULT_MIN_CACHEABLE_TOKENS
    min_cacheable_tokens_by_model: Mapping[str, int] = field(default_factory=dict)

    def min_cacheable_for(self, model: str) -> int:
        return self.min_cacheable_tokens_by_model.get(model, self.min_cacheable_tokens)


def _tokens(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"[messages] {where} must be a non-negative integer, not {value!r}")
    return value


def parse_messages_settings(values: Mapping[str, Any]) -> MessagesSettings:
    """Build the settings from the `[messages]` table; raises `ConfigError` on unknown keys or bad values."""
    values = dict(values)
    default = _tokens(values.pop("min_cacheable_tokens", DEFAULT_MIN_CACHEABLE_TOKENS), "min_cacheable_tokens")
    by_model = values.pop("min_cacheable_tokens_by_model", {})
    if not isinstance(by_model, Mapping):
        raise ConfigError("[messages] min_cacheable_tokens_by_model must be a table of model = tokens")
    if values:
        raise ConfigError(f"unknown [messages] keys: {sorted(values)}")
    parsed = {
        str(model): _tokens(tokens, f"min_cacheable_tokens_by_model.{model}") for model, tokens in by_model.items()
    }
    return MessagesSettings(default, parsed)
