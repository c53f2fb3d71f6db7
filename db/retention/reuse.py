"""What the records say about one prefix's cache entries: the reads each tier served, and the entries lost to
eviction (by the tier they were last held in) and to expiry (by the retention class they were sent with).

Per request row of the prefix, in time order (`PrefixReuseTally.add`):

- **reads**: `cached_tokens_device`, `cached_tokens_host`, `cached_tokens_disk` add to their tier (requests served by
  the tier, tokens); cached tokens without a tier split count under `unreported`.
- **evicted**: the ledger's `lost_evicted_tokens` > 0, by `evicted_tier` (`unknown` when not said); a row without a
  ledger (`lost_evicted_tokens` NULL) counts when its `miss_kind` is `evicted` (tokens not known: 0 added).
- **expired**: `lost_expired_tokens` > 0, or `miss_kind` `expired` without a ledger, by `retention_class` (`default`
  when none was sent), with the request's `idle_s` (seconds since its conversation's previous turn) when recorded.

An entry's reads before it was lost: the requests with cached tokens since the previous loss (or the first use), so
`reads_before / count` is how often an entry was read, on average, before it was evicted (or expired).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from db.records import CACHE_TIERS

UNREPORTED_TIER: Final = "unreported"  # cached tokens the upstream did not split by tier
UNKNOWN_TIER: Final = "unknown"  # an eviction whose tier was not said
DEFAULT_CLASS_LABEL: Final = "default"  # an expiry of a request that sent no retention class


def was_evicted(lost_evicted_tokens: int | None, miss_kind: str | None) -> bool:
    """Whether a request found (part of) its cached prefix evicted: the ledger's count when the row has one, else the
    engine's `miss_kind`."""
    if lost_evicted_tokens is not None:
        return lost_evicted_tokens > 0
    return miss_kind == "evicted"


def was_expired(lost_expired_tokens: int | None, miss_kind: str | None) -> bool:
    """Whether a request found (part of) its cached prefix expired (as `was_evicted`)."""
    if lost_expired_tokens is not None:
        return lost_expired_tokens > 0
    return miss_kind == "expired"


@dataclass(frozen=True, slots=True)
class TierReads:
    """Reads served by one tier (`device`, `host`, `disk`, or `unreported`): requests and cached tokens."""

    tier: str
    requests: int
    tokens: int


@dataclass(frozen=True, slots=True)
class EntryLosses:
    """Entries lost one way, grouped by `key` (the tier for evictions, the retention class for expiries): how many,
    the tokens the ledger counted lost (rows without a ledger add none), the reads those entries had served before,
    and for expiries the median idle time (seconds; None when no row recorded one)."""

    key: str
    count: int
    tokens: int
    reads_before: int
    median_idle_s: float | None = None

    @property
    def reads_per_entry(self) -> float:
        """Reads an entry served, on average, before it was lost."""
        return self.reads_before / self.count if self.count else 0.0


@dataclass(frozen=True, slots=True)
class PrefixReuse:
    """One prefix's reuse by tier and by retention class (see the module doc); tuples ordered by tier
    (`CACHE_TIERS`, then `unreported`/`unknown`) or by class name."""

    reads: tuple[TierReads, ...] = ()
    evicted: tuple[EntryLosses, ...] = ()
    expired: tuple[EntryLosses, ...] = ()

    @property
    def evictions(self) -> int:
        return sum(loss.count for loss in self.evicted)

    @property
    def expiries(self) -> int:
        return sum(loss.count for loss in self.expired)

    def read_tokens_by_tier(self) -> dict[str, int]:
        """Cached tokens each tier served (tiers only: `unreported` left out)."""
        return {r.tier: r.tokens for r in self.reads if r.tier in CACHE_TIERS}

    @property
    def main_eviction_tier(self) -> str | None:
        """The tier most entries were evicted from (None: no eviction)."""
        if not self.evicted:
            return None
        return max(self.evicted, key=lambda loss: (loss.count, -_tier_rank(loss.key))).key


@dataclass
class _Group:
    count: int = 0
    tokens: int = 0
    reads_before: int = 0
    idle: list[float] = field(default_factory=list)


@dataclass
class PrefixReuseTally:
    """Accumulates `PrefixReuse` from a prefix's request rows, fed in time order."""

    reads: dict[str, list[int]] = field(default_factory=dict)  # tier -> [requests, tokens]
    evicted: dict[str, _Group] = field(default_factory=dict)
    expired: dict[str, _Group] = field(default_factory=dict)
    reads_since_loss: int = 0

    def add(self, row: Any) -> bool:
        """One request row (attributes as the `requests` columns). Returns whether it found its entry evicted."""
        tiers = {tier: getattr(row, f"cached_tokens_{tier}") for tier in CACHE_TIERS}
        cached = int(row.cached_tokens or 0)
        if all(tokens is not None for tokens in tiers.values()):
            for tier, tokens in tiers.items():
                if tokens:
                    self._read(tier, int(tokens))
        elif cached:
            self._read(UNREPORTED_TIER, cached)
        evicted = was_evicted(row.lost_evicted_tokens, row.miss_kind)
        if evicted:
            self._lose(self.evicted, row.evicted_tier or UNKNOWN_TIER, row.lost_evicted_tokens, None)
        elif was_expired(row.lost_expired_tokens, row.miss_kind):
            self._lose(self.expired, row.retention_class or DEFAULT_CLASS_LABEL, row.lost_expired_tokens, row.idle_s)
        if cached:
            self.reads_since_loss += 1
        return evicted

    def _read(self, tier: str, tokens: int) -> None:
        counts = self.reads.setdefault(tier, [0, 0])
        counts[0] += 1
        counts[1] += tokens

    def _lose(self, groups: dict[str, _Group], key: str, tokens: int | None, idle_s: float | None) -> None:
        group = groups.setdefault(key, _Group())
        group.count += 1
        group.tokens += int(tokens or 0)
        group.reads_before += self.reads_since_loss
        if idle_s is not None:
            group.idle.append(float(idle_s))
        self.reads_since_loss = 0

    def result(self) -> PrefixReuse:
        reads = tuple(TierReads(tier, n, tokens) for tier, (n, tokens) in sorted(
            self.reads.items(), key=lambda item: _tier_rank(item[0])))
        evicted = tuple(_losses(key, group) for key, group in sorted(
            self.evicted.items(), key=lambda item: _tier_rank(item[0])))
        expired = tuple(_losses(key, group) for key, group in sorted(self.expired.items()))
        return PrefixReuse(reads, evicted, expired)


def _losses(key: str, group: _Group) -> EntryLosses:
    idle = sorted(group.idle)
    median = idle[len(idle) // 2] if idle else None
    return EntryLosses(key, group.count, group.tokens, group.reads_before, median)


def _tier_rank(tier: str) -> int:
    return CACHE_TIERS.index(tier) if tier in CACHE_TIERS else len(CACHE_TIERS)

