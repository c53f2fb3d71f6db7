"""A bounded memory of recently evicted or expired prefixes, by hash only, to tell `evicted` from `cold` and say what
was dropped: the tier it was last held in, its retention class and when it was last used."""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from dataclasses import dataclass

from local_engine.cache.types import MissKind


@dataclass(frozen=True, slots=True)
class DroppedPrefix:
    """How a prefix left the cache: `kind` (`evicted` / `expired`), `tier` (`device` / `host` / `disk`: the fastest
    tier holding it when it was dropped), `retention` (its lifetime's class: `5m`, `1h`, `persistent`, `default`) and
    `last_access_s` (the cache clock's seconds when a request last used it)."""

    kind: MissKind
    tier: str
    retention: str
    last_access_s: float

    def as_dict(self, now_s: float) -> dict:
        """The `dropped` object of the match report; `idle_s`: seconds from its last use to `now_s`."""
        return {"kind": self.kind.value, "tier": self.tier, "retention": self.retention,
                "idle_s": round(max(0.0, now_s - self.last_access_s), 3)}


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
        self._entries: OrderedDict[bytes, DroppedPrefix] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def remember(self, key: bytes, dropped: DroppedPrefix) -> None:
        if self.capacity <= 0:
            return
        self._entries[key] = dropped
        self._entries.move_to_end(key)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def lookup(self, key: bytes) -> DroppedPrefix | None:
        return self._entries.get(key)

    def clear(self) -> None:
        self._entries.clear()
