"""The write-back cleaner: while the engine is idle, give the device nodes next in line for eviction a host copy.

Under write_back a device node's only copy is its device one, so evicting it means copying it down first, and that
copy used to be paid inside the time to first token of whichever request needed the room. The cleaner does the copy
ahead of time (the page cache's writeback of dirty pages): an unlocked device node without a lower copy, least
likely to be kept first (the eviction order), gets a spare host copy. When eviction later takes its device copy, the
node already has a copy below, so its device slots are just given back (`tier_eviction.release_copy`), and that is
when `demoted_tokens_total` counts it: a cleaned node that is never evicted was never moved out.

Room in the host tier: free slots first; else only copies that eviction would take out before this node's own (an
older eviction key) may go, the same ones an on-demand demotion of this node would push out. Work is bounded per
call (`max_tokens`) and done in pieces of CLEAN_CHUNK_TOKENS: between pieces `should_stop()` (a request is waiting)
pauses it, so a request never waits for more than one piece. A paused copy (`PendingCopy`, its host slots held by
TierStore.pending_clean) resumes at the next idle tick; if eviction wants that node first, `finish_pending` copies
only the rest; if the node changed meanwhile (split, dropped, given a host copy otherwise), the copy is abandoned and
its slots given back. The per-tier integrity check counts the pending copy's host slots.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from local_engine.cache.tiers import eviction as tier_eviction
from local_engine.cache.radix_node import RadixNode
from local_engine.cache.tiers.store import DEVICE, HOST

DEFAULT_CLEAN_TOKENS = 4096  # per idle tick: a ~2k-token prefix or two, then the worker looks for requests again
CLEAN_CHUNK_TOKENS = 256  # per piece: what a request arriving mid-copy may wait for (~12 MB for fp32 SmolLM2-135M)


@dataclass
class PendingCopy:
    """A host copy of `node` under way: `host_slots[:copied_tokens]` already hold the KV of
    `device_slots[:copied_tokens]`; `device_slots` is the node's device slot tensor when the copy began (a split or
    a drop replaces it, which is how a stale copy is recognized)."""

    node: RadixNode
    device_slots: torch.Tensor
    host_slots: torch.Tensor
    copied_tokens: int = 0

    @property
    def still_valid(self) -> bool:
        node = self.node
        return node.parent is not None and node.slots is self.device_slots and node.host_slots is None


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


def clean(cache, max_tokens: int = DEFAULT_CLEAN_TOKENS, should_stop: Callable[[], bool] = lambda: False,
          chunk_tokens: int = CLEAN_CHUNK_TOKENS) -> int:
    """Copy dirty device nodes down to the host tier, in pieces, up to about `max_tokens` tokens or until
    `should_stop()`; returns the tokens copied (0 when there is nothing to clean, no host tier, or write_through,
    which copies down at insert already)."""
    tiers = cache.tiers
    if not tiers.enabled(HOST) or tiers.write_through:
        return 0
    copied = 0
    while copied < max_tokens and not should_stop():
        pending = _current(cache)
        if pending is None:
            break
        copied += _copy_piece(cache, pending, chunk_tokens)
    return copied


def finish_pending(cache, node: RadixNode) -> None:
    """Eviction is about to take `node`'s device copy: if the cleaner was copying it, copy the rest now (cheaper
    than starting over), so the node has its host copy."""
    pending = cache.tiers.pending_clean
    if pending is None or pending.node is not node:
        return
    if not pending.still_valid:
        abandon_pending(cache)
        return
    _copy_piece(cache, pending, node.num_tokens)


def abandon_pending(cache) -> None:
    """Give back the host slots of a copy under way (it is stale, or the host tier needs the room)."""
    pending = cache.tiers.pending_clean
    if pending is not None:
        cache.tiers.host_allocator.free(pending.host_slots)
        cache.tiers.pending_clean = None


def _current(cache) -> PendingCopy | None:
    """The copy to work on: the paused one if still valid, else a new one for the first dirty node with room."""
    tiers = cache.tiers
    pending = tiers.pending_clean
    if pending is not None:
        if pending.still_valid:
            return pending
        abandon_pending(cache)
    for node in dirty_nodes(cache):
        if _room_for(cache, node):
            slots = tiers.host_allocator.alloc(node.num_tokens)
            if slots is None:
                continue
            tiers.pending_clean = PendingCopy(node, node.slots, slots)
            return tiers.pending_clean
    return None


def _copy_piece(cache, pending: PendingCopy, max_tokens: int) -> int:
    """Copy up to `max_tokens` more tokens of `pending`; attach the host copy to the node once complete."""
    tiers, node = cache.tiers, pending.node
    start = pending.copied_tokens
    end = min(node.num_tokens, start + max_tokens)
    tiers.copy_device_to_host(pending.device_slots[start:end], pending.host_slots[start:end])
    pending.copied_tokens = end
    if end == node.num_tokens:
        cache.account(node, -1)
        node.host_slots = pending.host_slots
        cache.account(node, 1)
        tiers.pending_clean = None
        tiers.cleaned_tokens_total += node.num_tokens
    return end - start


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
