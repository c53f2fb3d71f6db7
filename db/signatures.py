"""`PromptSignature`: keyed hashes of a prompt's blocks and tools, from which fleet patterns are found without text.

The static head of a prompt (the system prompt of a chat request, the prompt of a completion) is cut into blocks of
`block_chars` characters twice: from its start (`head`) and from its end (`tail`, last block first), so two prompts
that differ only in one span share leading `head` blocks and leading `tail` blocks, whatever the span's length. Each
block is hashed on its own (not chained) with the gateway's fleet key, so equal blocks are equal across tenants while
the database reveals nothing about the text (`gateway.record_keys`). `tools` holds one keyed hash per tool, in the
order the request sent them; `tool_chars` their serialised length. Hashes are non-negative 63-bit integers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from db.chains import pack_hash_ids, unpack_hash_ids


@dataclass(frozen=True, slots=True)
class PromptSignature:
    """Keyed block hashes of a prompt's static head (`text_chars` characters long) and its tools.

    `prompt_chars` and `prompt_tokens` (None: unknown) convert characters to tokens for the pattern's cost.
    """

    block_chars: int
    text_chars: int
    head: tuple[int, ...]
    tail: tuple[int, ...]
    tools: tuple[int, ...]
    tool_chars: int
    prompt_chars: int
    prompt_tokens: int | None = None

    def tokens_per_char(self) -> float:
        """The request's own tokens per character (4 characters a token when unknown)."""
        if self.prompt_tokens and self.prompt_chars:
            return self.prompt_tokens / self.prompt_chars
        return 0.25

    def to_dict(self) -> dict[str, Any]:
        return {
            "block_chars": self.block_chars,
            "text_chars": self.text_chars,
            "head": list(self.head),
            "tail": list(self.tail),
            "tools": list(self.tools),
            "tool_chars": self.tool_chars,
            "prompt_chars": self.prompt_chars,
            "prompt_tokens": self.prompt_tokens,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PromptSignature:
        return cls(
            block_chars=int(data["block_chars"]),
            text_chars=int(data["text_chars"]),
            head=tuple(int(h) for h in data["head"]),
            tail=tuple(int(h) for h in data["tail"]),
            tools=tuple(int(h) for h in data["tools"]),
            tool_chars=int(data["tool_chars"]),
            prompt_chars=int(data["prompt_chars"]),
            prompt_tokens=None if data.get("prompt_tokens") is None else int(data["prompt_tokens"]),
        )

    def packed(self) -> dict[str, bytes]:
        """The hash lists as packed little-endian int64 (`prompt_signatures` columns)."""
        return {"head": pack_hash_ids(self.head), "tail": pack_hash_ids(self.tail), "tools": pack_hash_ids(self.tools)}

    @staticmethod
    def unpack(data: bytes) -> tuple[int, ...]:
        return unpack_hash_ids(data)
