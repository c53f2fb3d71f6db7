"""Chained hashes of a prompt's fixed-size blocks: the compact trace format KV-cache simulators replay.

Block i's hash covers the namespace and every token up to the end of block i, so two prompts share a hash exactly
when they share that whole prefix (in the same namespace): equal hashes mean a cache could have reused the block.
"""

from __future__ import annotations

import hashlib
from array import array

MAX_BLOCK_SIZE = 1024


def page_hash_chain(namespace: str, token_ids: list[int] | tuple[int, ...], block_size: int) -> list[int]:
    """One non-negative 63-bit hash per full block of `block_size` tokens (a trailing partial block has none)."""
    if not 1 <= block_size <= MAX_BLOCK_SIZE:
        raise ValueError(f"block_size must be between 1 and {MAX_BLOCK_SIZE}")
    previous = hashlib.blake2b(namespace.encode(), digest_size=8).digest()
    hashes = []
    for start in range(0, len(token_ids) - len(token_ids) % block_size, block_size):
        block = array("i", token_ids[start : start + block_size]).tobytes()
        previous = hashlib.blake2b(previous + block, digest_size=8).digest()
        hashes.append(int.from_bytes(previous, "big") >> 1)
    return hashes
