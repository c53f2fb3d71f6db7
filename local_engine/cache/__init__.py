"""KV storage (KVPool), slot bookkeeping (SlotAllocator) and the prefix index (RadixCache, a PrefixCache), kept
apart on purpose."""

from local_engine.cache.kv_pool import KVPool, KVPoolConfig
from local_engine.cache.slot_allocator import SlotAllocator
from local_engine.cache.types import EvictedPrefix, InsertResult, MatchResult, MissKind
from local_engine.cache.radix_cache import RadixCache, RadixCacheConfig
from local_engine.cache.no_prefix_cache import NoPrefixCache
from local_engine.cache.protocol import PrefixCache

__all__ = [
    "EvictedPrefix",
    "InsertResult",
    "KVPool",
    "KVPoolConfig",
    "MatchResult",
    "MissKind",
    "NoPrefixCache",
    "PrefixCache",
    "RadixCache",
    "RadixCacheConfig",
    "SlotAllocator",
]
