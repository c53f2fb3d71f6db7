"""The prefix-cache interface the engine is written against: RadixCache and the NoPrefixCache baseline implement it.

The shape is mini-sglang's and SGLang's `mem_cache` base (match, lock/unlock, insert, evict, an integrity check the
tests call after every operation), plus what prefixscope's engine asks of a cache besides: expiry, flush, the
read-only views of `/v1/cache`, and the lower tiers (`tiers`, None without them). Callers serialize access (the
engine holds one lock around every call).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from local_engine.cache.tree_views import CacheStats
    from local_engine.cache.types import EvictedPrefix, InsertResult, MatchResult


@runtime_checkable
class PrefixCache(Protocol):
    """What the engine calls on its prefix cache. Token counts are tokens; slots are int64 KV pool slot ids."""

    page_size: int  # tokens per page: matches and stored prefixes are whole pages
    evicted_tokens_total: int  # monotonic: tokens removed to make room
    expired_tokens_total: int  # monotonic: tokens removed by TTL

    @property
    def tiers(self) -> Any:
        """The lower tiers' movement (`local_engine.cache.tiers.movement.TierMovement`), None without them."""

    @property
    def cached_tokens(self) -> int:
        """Tokens whose KV is in the device pool and indexed."""

    @property
    def evictable_tokens(self) -> int:
        """Device tokens held by unlocked prefixes (what `evict` can free)."""

    @property
    def protected_tokens(self) -> int:
        """Device tokens held by locked prefixes."""

    def max_matchable_tokens(self, num_prompt_tokens: int) -> int:
        """The most tokens of a prompt this long a match may cover (the last token is always computed)."""

    def match(
        self, namespace: str, token_ids: list[int], *, dry_run: bool = False, retention: str | None = None
    ) -> MatchResult:
        """The longest cached prefix of `token_ids` in `namespace`; `dry_run` changes nothing. Raises ValueError for
        an unknown retention class."""

    def remember_seen(self, namespace: str, token_ids: list[int]) -> None:
        """Remember `token_ids` as sent in `namespace` (what `MatchResult.seen_tokens` counts), caching nothing."""

    def lock(self, node: Any) -> None:
        """Protect a matched or inserted prefix (`MatchResult.node`, `InsertResult.node`) from eviction."""

    def unlock(self, node: Any) -> None:
        """Undo one `lock(node)`; raises RuntimeError for a node that is not locked."""

    def insert(
        self, namespace: str, token_ids: list[int], slots: torch.Tensor, retention: str | None = None
    ) -> InsertResult:
        """Index `token_ids` with their KV in device `slots` (int64 `[len(token_ids)]`); the cache owns the slots it
        stores, the caller frees the rest (see `InsertResult`)."""

    def evict(self, num_tokens: int) -> list[EvictedPrefix]:
        """Free at least `num_tokens` device slots from unlocked prefixes (fewer only when nothing else can go);
        returns the prefixes that left the cache."""

    def expire(self) -> list[EvictedPrefix]:
        """Drop unlocked prefixes idle past their lifetime; returns them."""

    def flush(self) -> int:
        """Drop every unlocked prefix; returns the tokens removed."""

    def stats(self) -> CacheStats:
        """Device occupancy and totals (`/v1/cache`)."""

    def tier_stats(self) -> dict[str, dict]:
        """Per tier (device, host, disk): the `/v1/cache` "tiers" object."""

    def snapshot(self, max_nodes: int) -> dict:
        """A bounded view of what is cached, per namespace (`/v1/cache/tree`)."""

    def check_integrity(self, num_slots_outside_tree: int = 0) -> None:
        """Raise AssertionError unless every invariant holds, counting `num_slots_outside_tree` device slots that
        in-flight requests hold outside the cache."""
