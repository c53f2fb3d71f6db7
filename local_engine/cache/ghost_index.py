"""A bounded memory of recently evicted or expired prefixes, by hash only, to tell `evicted` from `cold`."""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict

from local_engine.cache.types import MissKind


def prefix_hash(namespace: str, token_ids: list[int] | tuple[int, ...]) -> bytes:
    digest = hashlib.blake2b(namespace.encode(), digest_size=16)
    digest.update(array("i", token_ids).tobytes())
    return digest.digest()


class GhostIndex:
    """Maps the hash of (namespace, tokens up to the first page a removal took away) to how it was removed.

    Keeping hashes rather than tokens bounds memory and keeps no prompt content after the KV is gone.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[bytes, MissKind] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def remember(self, key: bytes, kind: MissKind) -> None:
        if self.capacity <= 0:
            return
        self._entries[key] = kind
        self._entries.move_to_end(key)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def lookup(self, key: bytes) -> MissKind | None:
        return self._entries.get(key)

    def clear(self) -> None:
        self._entries.clear()
