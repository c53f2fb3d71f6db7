"""`RequestChain`: a prompt's block hash chain, the trace a what-if cache simulator replays.

Block i's hash stands for the whole prompt up to the end of block i, so two prompts share a hash exactly when a cache
could have reused that block for both. The chain is stored compactly, as packed little-endian int64 (8 bytes per
block), and travels through the spill file as a JSON object with the hashes as a list of integers.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1
HASH_BYTES: Final = 8


@dataclass(frozen=True, slots=True)
class RequestChain:
    """The block hash chain of one prompt.

    `block_size` is in tokens and `input_length` the prompt's length in tokens (a trailing partial block has no hash,
    so `len(hash_ids) == input_length // block_size` when the engine computed it). `approximate` is True when the
    gateway hashed text chunks itself because the engine did not return real token-block hashes.
    """

    block_size: int
    input_length: int
    hash_ids: tuple[int, ...]
    approximate: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.hash_ids, tuple):
            object.__setattr__(self, "hash_ids", tuple(self.hash_ids))
        if self.block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {self.block_size}")
        if self.input_length < 0:
            raise ValueError(f"input_length must not be negative, got {self.input_length}")
        if self.hash_ids and not (INT64_MIN <= min(self.hash_ids) and max(self.hash_ids) <= INT64_MAX):
            raise ValueError("hash ids must fit in a signed 64-bit integer")

    @property
    def num_blocks(self) -> int:
        """How many hashed blocks the chain holds."""
        return len(self.hash_ids)

    def packed_hash_ids(self) -> bytes:
        """The hashes as packed little-endian int64, as stored in `request_chains.hash_ids`."""
        return pack_hash_ids(self.hash_ids)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the spill file's form)."""
        return {
            "block_size": self.block_size,
            "input_length": self.input_length,
            "hash_ids": list(self.hash_ids),
            "approximate": self.approximate,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RequestChain:
        """The inverse of `to_dict`."""
        return cls(
            block_size=int(data["block_size"]),
            input_length=int(data["input_length"]),
            hash_ids=tuple(int(value) for value in data["hash_ids"]),
            approximate=bool(data.get("approximate", False)),
        )


def pack_hash_ids(hash_ids: Iterable[int]) -> bytes:
    """Pack signed 64-bit hashes little-endian, 8 bytes each (OverflowError for a value outside int64)."""
    packed = array("q", hash_ids)
    if sys.byteorder == "big":  # pragma: no cover - every supported platform is little-endian
        packed.byteswap()
    return packed.tobytes()


def unpack_hash_ids(data: bytes) -> tuple[int, ...]:
    """The inverse of `pack_hash_ids`."""
    if len(data) % HASH_BYTES:
        raise ValueError(f"a packed hash chain is a multiple of {HASH_BYTES} bytes, got {len(data)}")
    unpacked = array("q")
    unpacked.frombytes(data)
    if sys.byteorder == "big":  # pragma: no cover
        unpacked.byteswap()
    return tuple(unpacked)
