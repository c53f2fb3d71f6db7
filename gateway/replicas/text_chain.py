"""The gateway's own block hash chain of a prompt, over characters rather than tokens, for the approximate index.

Upstreams that publish no cache events (vLLM or SGLang without events configured) still get prefix-affine routing
this way, in the manner of SGLang's router, which matches on text: block `i`'s hash covers the namespace (the
tenant's salt), the model and every character up to the end of block `i`, so equal hashes mean a shared prefix.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import msgspec

from gateway.parsing import CHAT

_ENCODER = msgspec.json.Encoder(order="deterministic")


@dataclass(frozen=True, slots=True)
class TextChain:
    """`hashes[i]` covers characters `[0, (i + 1) * block_chars)` of the prompt's text; `num_chars` its length."""

    hashes: tuple[int, ...]
    block_chars: int
    num_chars: int


def prompt_material(endpoint: str, body: dict[str, Any]) -> str:
    """The prompt as the model sees it, in a stable serialization: tools first, then the messages, for chat (the
    order chat templates put them in); the prompt for completions."""
    if endpoint == CHAT:
        material: Any = [body.get("tools"), body.get("messages")]
    else:
        material = body.get("prompt")
        if isinstance(material, str):
            return material
    try:
        return _ENCODER.encode(material).decode("utf-8")
    except (TypeError, msgspec.EncodeError, UnicodeDecodeError):
        return ""


def text_chain(namespace: str, model: str, text: str, block_chars: int) -> TextChain:
    """One 63-bit hash per full block of `block_chars` characters (a trailing partial block has none)."""
    previous = hashlib.blake2b(f"{namespace}\x00{model}".encode(), digest_size=8).digest()
    hashes = []
    for start in range(0, len(text) - len(text) % block_chars, block_chars):
        block = text[start : start + block_chars].encode("utf-8", "surrogatepass")
        previous = hashlib.blake2b(previous + block, digest_size=8).digest()
        hashes.append(int.from_bytes(previous, "big") >> 1)
    return TextChain(tuple(hashes), block_chars, len(text))
