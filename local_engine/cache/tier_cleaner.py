"""The write-back cleaner: while the engine is idle, give the device nodes next in line for eviction a host copy.

Under write_back a device node's only copy is its device one, so evicting it means copying it down first, and that
copy used to be paid inside the time to first token of whichever request needed the room. The cleaner does the copy
ahead of time (the page cache's writeback of dirty pages): an unlocked device node without a lower copy, least
likely to be kept first (the eviction order), gets a spare host copy. When eviction later takes its device copy, the
node already has a copy below, so its device slots are just given back (`tier_eviction.release_copy`), and that is
when `demoted_tokens_total` counts it: a cleaned node that is never evicted was never moved out.

Room in the host tier: free slots first; else only copies that eviction would take out before this node's own (an
older eviction key) may go, the same ones an on-demand demotion of this node would push out. Work is bounded per
call (`max_tokens`) and stops between nodes when `should_stop()` says a request is waiting.
"""

from __future__ import annotations

from typing import Callable

from local_engine.cache import tier_eviction
from local_engine.cache.radix_node import RadixNode
from local_engine.cache.tier_store import DEVICE, HOST

DEFAULT_CLEAN_TOKENS = 4096  # per idle tick: a ~2k-token prefix or two, then the worker looks for requests again


def dirty_nodes(cache) -> list[RadixNode]:
    """Unlocked nodes whose only copy is on the device, in eviction order (first to go first)."""
    found, stack = [], list(cache.roots().values())
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        if (not node.is_root and node.lock_ref == 0 and node.slots is not None and node.host_slots is None
                and node.disk is None):
            found.append(node)
    found.sort(key=lambda node: (cache.eviction_key(node), node.node_id))
    return found


def clean(cache, max_tokens: int = DEFAULT_CLEAN_TOKENS, should_stop: Callable[[], bool] = lambda: False) -> int:
    """Copy dirty device nodes down to the host tier, up to about `max_tokens` tokens; returns the tokens copied
    (0 when there is nothing to clean, no host tier, or write_through, which copies down at insert already)."""
    tiers = cache.tiers
    if not tiers.enabled(HOST) or tiers.write_through:
        return 0
    cleaned = 0
    for node in dirty_nodes(cache):
        if cleaned >= max_tokens or should_stop():
            break
        if node.parent is None or node.host_slots is not None:  # dropped or copied by an earlier step
            continue
        if not _room_for(cache, node):
            continue
        k, v = tiers.read(node, DEVICE)
        cache.account(node, -1)
        tiers.put(node, HOST, k, v, cache.namespace_of(node))
        cache.account(node, 1)
        tiers.cleaned_tokens_total += node.num_tokens
        cleaned += node.num_tokens
    return cleaned


def _room_for(cache, node: RadixNode) -> bool:
    """Free host room for `node`, pushing out only host copies that go before it in eviction order."""
    tiers = cache.tiers
    short = node.num_tokens - tiers.free_tokens(HOST)
    if short <= 0:
        return True
    key = cache.eviction_key(node)
    older = sum(candidate.num_tokens for candidate in tier_eviction.candidates(cache, HOST)
                if cache.eviction_key(candidate) < key)
    if older < short:
        return False
    cache.lock(node)  # never the node's own ancestors' host copies: they are held while room is made
    try:
        tier_eviction.make_room(cache, HOST, short)
    finally:
        cache.unlock(node)
    return tiers.free_tokens(HOST) >= node.num_tokens
