"""The conversation id a client gives explicitly, in precedence order (`docs/conversations.md`).

1. the `x-prefixscope-session` request header;
2. the body's `prompt_cache_key` (OpenAI's cache-routing key: one per conversation is what OpenAI recommends; read
   before the gateway replaces it with the tenant's salt);
3. `metadata`: `session_id`, then `conversation_id` (OpenAI), then `user_id` (Anthropic's `metadata.user_id`);
4. the body's `user`.

The id is the client's own text: the tracker keys it per tenant before anything records it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

SESSION_HEADER: Final = "x-prefixscope-session"
SESSION_HEADER_BYTES: Final = SESSION_HEADER.encode()
METADATA_KEYS: Final = ("session_id", "conversation_id", "user_id")
MAX_ID_CHARS: Final = 512  # longer values are cut before keying (they stay distinct by their first 512 characters)


@dataclass(frozen=True, slots=True)
class ExplicitId:
    """A client-given conversation id: `source` is one of `header`, `prompt_cache_key`, `metadata`, `user`
    (`db.ledger.CONVERSATION_SOURCES`); `value` is the client's text (never recorded as is)."""

    source: str
    value: str


def _usable(value: Any) -> str | None:
    if isinstance(value, str) and value.strip():
        return value[:MAX_ID_CHARS]
    return None


def explicit_id(header: str | None, body: Mapping[str, Any] | None) -> ExplicitId | None:
    """The first id present, by the precedence above; None when the request carries none (an empty or non-string
    value counts as absent). `body` is the request as the client sent it."""
    value = _usable(header)
    if value is not None:
        return ExplicitId("header", value)
    if not isinstance(body, Mapping):
        return None
    value = _usable(body.get("prompt_cache_key"))
    if value is not None:
        return ExplicitId("prompt_cache_key", value)
    metadata = body.get("metadata")
    if isinstance(metadata, Mapping):
        for key in METADATA_KEYS:
            value = _usable(metadata.get(key))
            if value is not None:
                return ExplicitId("metadata", value)
    value = _usable(body.get("user"))
    if value is not None:
        return ExplicitId("user", value)
    return None
