"""Small named results shared by RadixCache and NoPrefixCache."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import torch

from local_engine.cache.tiers import TierTokens


class MissKind(str, enum.Enum):
    """Why a request did (not) reuse cached KV, as reported in `x-prefix-cache-miss`."""

    HIT = "hit"  # everything that can be served from cache was (all but the last token, page-aligned)
    PARTIAL = "partial"  # a prefix matched, then the prompt diverged from anything cached
    COLD = "cold"  # nothing matched and nothing like it was cached recently
    EVICTED = "evicted"  # the next part was cached, then evicted to make room
    EXPIRED = "expired"  # the next part was cached, then dropped by the TTL


@dataclass(frozen=True)
class MatchResult:
    """The cached prefix of a prompt: `slots` (int64 `[matched_tokens]`) hold its KV, `node` is what to lock."""

    slots: torch.Tensor
    matched_tokens: int
    prompt_tokens: int
    miss_kind: MissKind
    node: Any  # an opaque handle for lock/unlock; None when nothing matched
    tier_tokens: TierTokens | None = None  # matched tokens by the tier holding them; None: all on the device
    load_ms: float = 0.0  # time spent loading the host and disk part into device slots (after `load_back`)
    # The longest prefix an earlier request in the namespace computed (`SeenIndex.seen_tokens`; >= matched_tokens),
    # and for an evicted/expired miss what was dropped (`DroppedPrefix.as_dict`: kind, tier, retention, idle_s).
    seen_tokens: int = 0
    dropped: dict | None = None

    @property
    def cached_tokens(self) -> int:
        return self.matched_tokens


@dataclass(frozen=True)
class EvictedPrefix:
    """A prefix removed by eviction or expiry: its last `num_tokens` tokens of `token_ids` are gone."""

    namespace: str
    token_ids: tuple[int, ...]
    num_tokens: int
    expired: bool


@dataclass(frozen=True)
class InsertResult:
    """`num_cached_tokens`: how much of the inserted sequence the tree already held (the caller frees its own
    duplicate slots there). `num_stored_tokens`: the page-aligned length now indexed (the caller frees the tail)."""

    num_cached_tokens: int
    num_stored_tokens: int
    node: Any = None  # the node ending at `num_stored_tokens`, to lock what was just stored
