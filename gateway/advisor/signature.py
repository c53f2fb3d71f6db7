"""A sampled request's `PromptSignature` (`db.signatures`): keyed hashes of its static head's blocks and of
each tool, for the fleet patterns. Computed in the advisor's worker thread (charged to its CPU budget), never on the
request path, and bounded: at most `MAX_BLOCKS` blocks from each end and `MAX_TOOLS` tools.

The static head is the chat request's leading system (or developer) messages, or the completion's prompt. Every hash
is keyed BLAKE2b-64 (RFC 7693 keyed mode) under the gateway's fleet key (`gateway.record_keys.RecordHasher.fleet_key`),
shifted to 63 bits: equal blocks hash equal across tenants, and the database alone reveals nothing about the text.
"""

from __future__ import annotations

import hashlib
from typing import Any, Final

import msgspec

from db.patterns.finder import MAX_TOOLS
from db.signatures import PromptSignature
from gateway.explain.chains import canonical_prompt_text
from gateway.parsing import CHAT

BLOCK_CHARS: Final = 64
MAX_BLOCKS: Final = 64
_ENCODER = msgspec.json.Encoder(order="sorted")
_HEAD_ROLES = frozenset({"system", "developer"})


def static_head(endpoint: str, body: dict[str, Any]) -> str:
    """The text meant to be the same on every call: leading system/developer messages, or the completion prompt."""
    if endpoint != CHAT:
        return canonical_prompt_text(endpoint, body)
    parts = []
    for message in body.get("messages") or ():
        if not isinstance(message, dict) or message.get("role") not in _HEAD_ROLES:
            break
        content = message.get("content")
        if isinstance(content, list):
            texts = (part.get("text") for part in content if isinstance(part, dict))
            content = "".join(text for text in texts if isinstance(text, str))
        parts.append(content if isinstance(content, str) else "")
    return "\n".join(parts)


def _hash(data: bytes, key: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8, key=key[:64]).digest(), "big") >> 1


def prompt_signature(endpoint: str, body: dict[str, Any], key: bytes, prompt_tokens: int | None) -> PromptSignature:
    """The signature of `body` (as the upstream got it) under the fleet `key` (at most 64 bytes used)."""
    text = static_head(endpoint, body)
    data = text.encode("utf-8", "surrogatepass")
    size = len(data)
    full = size // BLOCK_CHARS
    head = tuple(_hash(data[i * BLOCK_CHARS : (i + 1) * BLOCK_CHARS], key) for i in range(min(full, MAX_BLOCKS)))
    tail = tuple(
        _hash(data[size - (i + 1) * BLOCK_CHARS : size - i * BLOCK_CHARS], key) for i in range(min(full, MAX_BLOCKS))
    )
    tools_value = body.get("tools") if endpoint == CHAT else None
    tools = tools_value[:MAX_TOOLS] if isinstance(tools_value, list) else []
    encoded = [_ENCODER.encode(tool) for tool in tools]
    return PromptSignature(
        block_chars=BLOCK_CHARS,
        text_chars=size,
        head=head,
        tail=tail,
        tools=tuple(_hash(item, key) for item in encoded),
        tool_chars=sum(len(item) for item in encoded),
        prompt_chars=len(canonical_prompt_text(endpoint, body).encode("utf-8", "surrogatepass")) or 1,
        prompt_tokens=prompt_tokens,
    )
