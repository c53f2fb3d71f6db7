"""Eviction policies: which unlocked leaf goes first. Lower priority values are evicted first."""

from __future__ import annotations

from typing import Callable

from local_engine.cache.radix_node import RadixNode

EvictionPolicy = Callable[[RadixNode], tuple[float, ...]]


def least_recently_used(node: RadixNode) -> tuple[float, ...]:
    return (node.last_access_s, node.node_id)


def first_in_first_out(node: RadixNode) -> tuple[float, ...]:
    return (node.created_s, node.node_id)


def least_frequently_used(node: RadixNode) -> tuple[float, ...]:
    return (node.hit_count, node.last_access_s, node.node_id)


EVICTION_POLICIES: dict[str, EvictionPolicy] = {
    "lru": least_recently_used,
    "fifo": first_in_first_out,
    "lfu": least_frequently_used,
}


def eviction_policy(name: str) -> EvictionPolicy:
    try:
        return EVICTION_POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown eviction policy {name!r}; choose one of {sorted(EVICTION_POLICIES)}") from None
