"""TierMovement: every move of KV between tiers, behind one object (`RadixCache.tiers`).

It pairs the radix tree (which node holds which copy, the per-tier counts) with the TierStore (the copies' bytes
and slots). The policies live in their own modules, each taking this object: which copies leave a tier and where
they go (`eviction`), loading a match's lower part back into device slots (`loading`), the idle write-back cleaner
(`cleaner`), the disk tier across restarts (`persistence`) and the per-tier integrity check (`integrity`). Callers
serialize access, as for the cache.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch

from local_engine.cache.tiers import cleaner, eviction, integrity, loading, persistence

if TYPE_CHECKING:
    from local_engine.cache.radix_node import RadixNode
    from local_engine.cache.radix_tree import RadixTree
    from local_engine.cache.tiers.store import TierStore
    from local_engine.cache.types import EvictedPrefix, MatchResult


class TierMovement:
    def __init__(self, tree: RadixTree) -> None:
        self.tree = tree
        self.store: TierStore = tree.store

    def make_room(self, tier: int, num_tokens: int) -> list[EvictedPrefix]:
        """Take copies out of `tier` (0 device, 1 host, 2 disk) until `num_tokens` of its space came free, demoting
        or dropping them (`eviction`); returns the prefixes that left the tree."""
        return eviction.make_room(self, tier, num_tokens)

    def copy_down(self, node: RadixNode, namespace: str) -> list[EvictedPrefix]:
        """write_through: give a newly stored device node its copies in the enabled lower tiers."""
        return eviction.copy_down(self, node, namespace)

    def load_back(
        self, namespace: str, token_ids: list[int], match: MatchResult, slots: torch.Tensor
    ) -> MatchResult:
        """Load the host and disk part of a locked `match` into device `slots`; returns the match as served
        (`loading.load_back`)."""
        return loading.load_back(self, namespace, token_ids, match, slots)

    def clean(
        self,
        max_tokens: int = cleaner.DEFAULT_CLEAN_TOKENS,
        should_stop: Callable[[], bool] = lambda: False,
        chunk_tokens: int = cleaner.CLEAN_CHUNK_TOKENS,
    ) -> int:
        """write_back: copy the device-only nodes next in line for eviction to the host tier ahead of time, in
        pieces, until `max_tokens` or `should_stop()`; returns the tokens copied (`cleaner`)."""
        return cleaner.clean(self, max_tokens, should_stop, chunk_tokens)

    def dirty_nodes(self) -> list[RadixNode]:
        """Unlocked nodes whose only copy is on the device, first to be evicted first."""
        return cleaner.dirty_nodes(self)

    def rebuild(self) -> int:
        """Index the disk tier's directory into the tree (headers only); returns the nodes rebuilt."""
        return persistence.rebuild_from_disk(self)

    def persist(self) -> int:
        """Write every cached node not yet on disk to the disk tier; returns the tokens written."""
        return persistence.persist_to_disk(self)

    def stats(self) -> dict[str, dict]:
        """Per tier (device, host, disk): the `/v1/cache` "tiers" object."""
        return eviction.tier_stats(self)

    def check_integrity(self, num_slots_outside_tree: int) -> None:
        """Raise AssertionError unless every tier's counts and copies are consistent (`integrity`)."""
        integrity.check_tier_integrity(self, num_slots_outside_tree)
