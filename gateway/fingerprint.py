"""What the record keeps about a prompt: a hash of its stable prefix, and optionally its text.

`prefix_hash` identifies the part of a chat request that is meant to be shared between calls (the model, the
tool definitions and the leading system/developer messages) after normalization, so the dashboard can group
requests by prefix and show which prefixes hit and which miss. Completions have no such structure; their hash
covers the first `COMPLETION_PREFIX_CHARS` characters of the prompt.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

from gateway.parsing import CHAT, RESPONSES

_ENCODER = msgspec.json.Encoder(order="deterministic")
COMPLETION_PREFIX_CHARS = 2048


def _leading_instructions(messages: list[Any]) -> list[Any]:
    leading = []
    for message in messages:
        if not isinstance(message, dict) or message.get("role") not in ("system", "developer"):
            break
        leading.append(message.get("content"))
    return leading


def _leading_items(items: Any) -> list[Any]:
    """The content of a Responses `input`'s leading system/developer messages (none for a string input)."""
    if not isinstance(items, list):
        return []
    leading = []
    for item in items:
        if not isinstance(item, dict) or item.get("type", "message") != "message":
            break
        if item.get("role") not in ("system", "developer"):
            break
        leading.append(item.get("content"))
    return leading


def prefix_material(endpoint: str, body: dict[str, Any]) -> bytes | None:
    """The canonical encoding of the request's stable prefix (see the module docstring), or None when it has none.
    A Responses request's prefix is its tools, its `instructions` and its input's leading system/developer messages."""
    if endpoint == CHAT:
        leading = _leading_instructions(body.get("messages") or [])
        tools = body.get("tools")
        if not leading and not tools:
            return None
        material: Any = [body.get("model"), tools, leading]
    elif endpoint == RESPONSES:
        instructions = body.get("instructions")
        leading = _leading_items(body.get("input"))
        tools = body.get("tools")
        if not leading and not tools and not instructions:
            return None
        material = [body.get("model"), tools, instructions, leading]
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list):
            prompt = prompt[0] if prompt else None
        if not isinstance(prompt, str) or not prompt:
            return None
        material = [body.get("model"), prompt[:COMPLETION_PREFIX_CHARS]]
    try:
        return _ENCODER.encode(material)
    except (TypeError, msgspec.EncodeError):
        return None


def prefix_hash(endpoint: str, body: dict[str, Any], key: bytes = b"") -> str | None:
    """16 hex characters, or None when the request has no recognisable prefix. With `key` (the tenant's record key,
    `gateway.record_keys`) the hash is keyed BLAKE2b, as every stored hash must be."""
    encoded = prefix_material(endpoint, body)
    if encoded is None:
        return None
    return hashlib.blake2b(encoded, digest_size=8, key=key).hexdigest()


def prompt_text(endpoint: str, body: dict[str, Any]) -> str | None:
    """The prompt as stored when a tenant opts in: the messages (chat) or the input (Responses) as JSON, the prompt
    for completions."""
    value = body.get({CHAT: "messages", RESPONSES: "input"}.get(endpoint, "prompt"))
    if isinstance(value, str):
        return value
    try:
        return _ENCODER.encode(value).decode("utf-8")
    except (TypeError, msgspec.EncodeError):
        return None
