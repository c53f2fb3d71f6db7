"""A prompt's block hash chain, recorded for the what-if cache simulator.

From the local engine the chain is exact: the gateway asks for it (`return_hash_chain`, `hash_block_size`) and reads
`prefix_cache.hash_chain` = {block_size, input_length, hash_ids} from the response body or a stream's usage chunk.
Other upstreams return nothing of the kind, so the gateway hashes the prompt's canonical text itself: fixed-size
chunks of about `block_size` tokens' worth of bytes (`CHARS_PER_TOKEN` per token), each hash chained to the one before
it and seeded with the tenant's salt, as the engine does with tokens. Such a chain is marked approximate: its blocks
are not token blocks and its `input_length` is the reported prompt tokens or an estimate from the text's length.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

from db.chains import INT64_MAX, RequestChain
from gateway.parsing import CHAT

CHARS_PER_TOKEN = 4
MAX_BLOCK_SIZE = 1024
_ENCODER = msgspec.json.Encoder()


def _positive_int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def engine_chain(prefix_cache: Any) -> RequestChain | None:
    """The chain in an engine's `prefix_cache` object, or None when it has none (or a malformed one)."""
    if not isinstance(prefix_cache, dict):
        return None
    chain = prefix_cache.get("hash_chain")
    if not isinstance(chain, dict):
        return None
    block_size = _positive_int(chain.get("block_size"))
    input_length = _positive_int(chain.get("input_length"))
    hash_ids = chain.get("hash_ids")
    if not block_size or input_length is None or not isinstance(hash_ids, list):
        return None
    if hash_ids and not (all(type(value) is int for value in hash_ids) and 0 <= min(hash_ids) <= max(hash_ids)):
        return None
    if hash_ids and max(hash_ids) > INT64_MAX:
        return None
    return RequestChain(block_size, input_length, tuple(hash_ids))


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [part.get("text") for part in content if isinstance(part, dict)]
        if all(isinstance(part, str) for part in parts):
            return "".join(parts)
    return _json(content)


def _json(value: Any) -> str:
    try:
        return _ENCODER.encode(value).decode("utf-8", "replace")
    except (TypeError, msgspec.EncodeError):
        return repr(value)


def canonical_prompt_text(endpoint: str, body: dict[str, Any]) -> str:
    """The prompt as an engine would roughly render it: tools, then each message's role and text (chat); the prompt
    itself (completions)."""
    if endpoint != CHAT:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        return prompt if isinstance(prompt, str) else _json(prompt)
    pieces = []
    tools = body.get("tools")
    if tools:
        pieces.append("# Tools\n" + "\n".join(_json(tool) for tool in tools) + "\n")
    for message in body.get("messages") or ():
        if not isinstance(message, dict):
            continue
        text = _text_of(message.get("content"))
        if message.get("tool_calls"):
            text += "\n" + _json(message["tool_calls"])
        pieces.append(f"<|{message.get('role')}|>\n{text}\n")
    return "".join(pieces)


def approximate_chain(text: str, namespace: str, block_size: int, prompt_tokens: int | None) -> RequestChain:
    """Chained hashes of `text`'s full chunks of `block_size * CHARS_PER_TOKEN` UTF-8 bytes."""
    if not 1 <= block_size <= MAX_BLOCK_SIZE:
        raise ValueError(f"block_size must be between 1 and {MAX_BLOCK_SIZE}")
    data = text.encode("utf-8", "surrogatepass")
    chunk_bytes = block_size * CHARS_PER_TOKEN
    previous = hashlib.blake2b(namespace.encode(), digest_size=8).digest()
    hash_ids = []
    for start in range(0, len(data) - len(data) % chunk_bytes, chunk_bytes):
        previous = hashlib.blake2b(previous + data[start : start + chunk_bytes], digest_size=8).digest()
        hash_ids.append(int.from_bytes(previous, "big") >> 1)
    input_length = prompt_tokens if prompt_tokens is not None else -(-len(text) // CHARS_PER_TOKEN)
    return RequestChain(block_size, input_length, tuple(hash_ids), approximate=True)


_DECODER = msgspec.json.Decoder()


def strip_hash_chain(payload: dict[str, Any]) -> dict[str, Any]:
    """A copy of a response body or chunk without `prefix_cache.hash_chain` (the input is not changed)."""
    prefix_cache = payload.get("prefix_cache")
    if not isinstance(prefix_cache, dict) or "hash_chain" not in prefix_cache:
        return payload
    return {**payload, "prefix_cache": {k: v for k, v in prefix_cache.items() if k != "hash_chain"}}


def body_without_hash_chain(body: bytes) -> bytes:
    """A JSON response body without `prefix_cache.hash_chain` (unchanged when it has none or is not JSON)."""
    try:
        payload = _DECODER.decode(body)
    except msgspec.DecodeError:
        return body
    if not isinstance(payload, dict):
        return body
    stripped = strip_hash_chain(payload)
    return body if stripped is payload else _ENCODER.encode(stripped)
